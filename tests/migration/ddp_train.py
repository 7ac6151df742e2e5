"""DistributedDataParallel with torch.distributed.checkpoint, as PyTorch's tutorials write it.

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"
    -    backend = "nccl"
    +    backend = "tpu_dist"

(here ``main(device)`` takes the device, and ``BACKEND`` maps it to its backend).

Everything else is the tutorials' script ("Getting Started with Distributed Data Parallel",
"Getting Started with Distributed Checkpoint"): ``torch.multiprocessing.spawn`` of 2 processes
that find each other through ``MASTER_ADDR``/``MASTER_PORT``, ``DistributedDataParallel`` on a
small model, a ``DistributedSampler`` with ``set_epoch``, AdamW, then ``dcp.save`` of an
``AppState`` (``get_state_dict`` of model and optimizer), one more epoch, and a fresh model and
optimizer that ``dcp.load`` the checkpoint and train the same epoch again. ``main(device)``
runs it (``"cpu"`` means gloo, the reference) and returns what
tests/slow/test_migration_dist.py compares against the CPU run: each rank's losses, the
parameters after the continued and the resumed epoch, and the checkpoint's contents.

Run it alone: ``python -m tests.migration.ddp_train tpu [RESULTS.pt]``.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from tests.migration import spawn_harness

BACKEND = {"cpu": "gloo", "cuda": "nccl", "tpu": "tpu_dist"}
WORLD_SIZE = 2


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(32, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


class AppState(Stateful):
    """What DCP saves and loads: the model's and the optimizer's state, through
    ``get_state_dict``/``set_state_dict`` (which undo DDP's ``module.`` prefix)."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self):
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optimizer_state}

    def load_state_dict(self, state_dict):
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])


def dataset():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(64, 10, generator=g), torch.randn(64, 5, generator=g))


def build(device):
    torch.manual_seed(0)
    model = ToyModel().to(device)
    ddp_model = DDP(model)
    optimizer = torch.optim.AdamW(ddp_model.parameters(), lr=1e-2)
    return ddp_model, optimizer


def train_epoch(ddp_model, optimizer, loader, epoch, device):
    loader.sampler.set_epoch(epoch)   # a different shuffle each epoch, the same on every rank
    loss_fn = nn.MSELoss()
    losses = []
    for inputs, labels in loader:
        inputs, labels = inputs.to(device), labels.to(device)
        optimizer.zero_grad()
        loss = loss_fn(ddp_model(inputs), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def parameters(ddp_model):
    return {name: p.detach().cpu() for name, p in ddp_model.module.named_parameters()}


def worker(rank, world_size, port, device, checkpoint_dir, results_dir):
    backend = BACKEND[device]
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend, rank=rank, world_size=world_size)

    ds = dataset()
    sampler = DistributedSampler(ds, num_replicas=world_size, rank=rank)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    ddp_model, optimizer = build(device)
    losses = train_epoch(ddp_model, optimizer, loader, 0, device)
    dcp.save({"app": AppState(ddp_model, optimizer)}, checkpoint_id=checkpoint_dir)
    continued = train_epoch(ddp_model, optimizer, loader, 1, device)

    fresh_model, fresh_optimizer = build(device)
    state = {"app": AppState(fresh_model, fresh_optimizer)}
    dcp.load(state, checkpoint_id=checkpoint_dir)
    resumed = train_epoch(fresh_model, fresh_optimizer, loader, 1, device)

    torch.save({"losses": losses, "continued": continued, "resumed": resumed,
                "parameters": parameters(ddp_model),
                "resumed_parameters": parameters(fresh_model),
                "parameter_devices": sorted({p.device.type for p in fresh_model.parameters()})},
               os.path.join(results_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()
    if device == "tpu":   # the suite's record of what ran where, not part of the tutorial
        spawn_harness.record_stats(os.path.join(results_dir, f"stats{rank}.pt"))


def main(device: str) -> dict:
    """Train on 2 spawned processes; return each rank's results and the checkpoint read back
    on the host."""
    return spawn_harness.run_spawned(worker, device, WORLD_SIZE)


if __name__ == "__main__":
    spawn_harness.run_as_script(main)
