"""FSDP2 (``fully_shard``) with a sharded torch.distributed.checkpoint, as PyTorch's tutorials
write it.

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"
    -    backend = "nccl"
    +    backend = "tpu_dist"

(here ``main(device)`` takes the device, and ``BACKEND`` maps it to its backend).

Everything else is the tutorials' script ("Getting Started with Fully Sharded Data Parallel
(FSDP2)", "Getting Started with Distributed Checkpoint"): ``torch.multiprocessing.spawn`` of 2
processes, ``init_device_mesh(device, (2,))``, ``fully_shard`` on every block and then on the
root (parameters become DTensors sharded on dim 0), Adam, a few steps, then the sharded state
dict (``get_model_state_dict``/``get_optimizer_state_dict``: DTensors, each rank writes its
shards) saved with ``dcp.save``, a few more steps, and a fresh sharded model and optimizer that
``dcp.load`` it, ``set_model_state_dict``/``set_optimizer_state_dict``, and take the same steps
again. ``main(device)`` runs it (``"cpu"`` means gloo, the reference) and returns what
tests/slow/test_migration_dist.py compares against the CPU run.

Run it alone: ``python -m tests.migration.fsdp2_train tpu [RESULTS.pt]``.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from tests.migration import spawn_harness
from tests.migration.ddp_train import BACKEND, WORLD_SIZE

VOCAB, DIM, HEADS, SEQ = 64, 32, 4, 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        # No qkv bias: a key bias has a zero gradient in exact arithmetic, and Adam turns the
        # rounding noise in that zero into full-size steps that no two devices agree on.
        self.wqkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM)
        self.w1, self.w2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.wqkv(self.attention_norm(x)).view(b, t, 3, HEADS, d // HEADS) \
            .permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, t, d))
        return x + self.w2(F.gelu(self.w1(self.ffn_norm(x))))


class Transformer(nn.Module):
    def __init__(self, n_layers=2):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(n_layers))
        self.norm, self.output = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def build(device):
    torch.manual_seed(0)
    model = Transformer()
    mesh = init_device_mesh(device, (WORLD_SIZE,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, optimizer


def batches(rank, steps, first=0):
    """Each rank's own batches (a rank's slice of the global batch), made on the host."""
    out = []
    for step in range(first, first + steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        out.append(torch.randint(0, VOCAB, (4, SEQ + 1), generator=g))
    return out


def train(model, optimizer, tokens, device):
    losses = []
    for batch in tokens:
        batch = batch.to(device)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def full_parameters(model):
    """Every parameter, gathered (``full_tensor``) onto the host."""
    return {name: p.full_tensor().cpu() for name, p in model.named_parameters()}


def worker(rank, world_size, port, device, checkpoint_dir, results_dir):
    backend = BACKEND[device]
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend, rank=rank, world_size=world_size)

    model, optimizer = build(device)
    sharded = {p.device.type for p in model.parameters() if isinstance(p, DTensor)}
    losses = train(model, optimizer, batches(rank, 3), device)
    dcp.save({"model": get_model_state_dict(model),
              "optim": get_optimizer_state_dict(model, optimizer)},
             checkpoint_id=checkpoint_dir)
    continued = train(model, optimizer, batches(rank, 2, first=3), device)

    fresh_model, fresh_optimizer = build(device)
    state = {"model": get_model_state_dict(fresh_model),
             "optim": get_optimizer_state_dict(fresh_model, fresh_optimizer)}
    dcp.load(state, checkpoint_id=checkpoint_dir)
    set_model_state_dict(fresh_model, state["model"])
    set_optimizer_state_dict(fresh_model, fresh_optimizer, state["optim"])
    resumed = train(fresh_model, fresh_optimizer, batches(rank, 2, first=3), device)

    torch.save({"losses": losses, "continued": continued, "resumed": resumed,
                "parameters": full_parameters(model),
                "resumed_parameters": full_parameters(fresh_model),
                "parameter_devices": sorted(sharded)},
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
