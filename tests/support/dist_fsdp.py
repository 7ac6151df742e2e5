"""DTensor and FSDP2 checks for the tpu_dist workers (tests/support/dist_workers.py runs them).

Each check runs inside an initialized group on every rank and compares with what one process
computes on the host: DTensor results with plain tensor ops, FSDP2 training (each rank on its
half of the batch) with one process training on the whole batch.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tests.support.dist_workers import same, data

VOCAB, WIDTH, HEADS, SEQ = 32, 16, 2, 8


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and an MLP."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        # No qkv bias: the key bias has a zero gradient (softmax ignores it), and Adam would
        # turn rounding noise in that zero into full-size steps that differ per run.
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.fc1, self.fc2 = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TinyLM(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def lm_loss(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def check_dtensor(rank, world):
    """DTensor on a tpu mesh: distribute, redistribute Shard<->Replicate, matmuls."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    torch.set_float32_matmul_precision("highest")
    mesh = init_device_mesh("tpu", (world,))
    assert mesh.device_type == "tpu"
    full, w = data(0, (4, 6)), data(1, (6, 2 * world))
    rows = distribute_tensor(full.to("tpu"), mesh, [Shard(0)])
    local = rows.to_local()
    assert local.device.type == "tpu" and tuple(local.shape) == (4 // world, 6), local.shape
    same(local, full.chunk(world)[rank], "distribute_tensor Shard(0)")
    same(rows.redistribute(mesh, [Replicate()]).to_local(), full, "Shard(0) -> Replicate")
    cols = rows.redistribute(mesh, [Shard(1)])
    same(cols.to_local(), full.chunk(world, dim=1)[rank], "Shard(0) -> Shard(1)")
    product = rows @ distribute_tensor(w.to("tpu"), mesh, [Replicate()])
    assert product.placements == (Shard(0),), product.placements
    same(product.full_tensor(), full @ w, "Shard(0) @ Replicate")
    # a contraction over the sharded dim: partial sums, reduced on redistribute
    partial = cols @ distribute_tensor(w.to("tpu"), mesh, [Shard(0)])
    same(partial.redistribute(mesh, [Replicate()]).to_local(), full @ w, "Shard(1) @ Shard(0)")
    same(rows.sum().full_tensor(), full.sum(), "sum over a sharded tensor")
    import torchtpu_compile
    fallbacks = torchtpu_compile.stats()["fallback_ops"]
    assert not any("dtensor" in op or "c10d" in op for op in fallbacks), fallbacks


class MLP(nn.Module):
    """The fast suite's FSDP2 model: the ops of the DDP check, already compiled by then."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(6, 16), nn.Tanh()),
                                     nn.Linear(16, 3)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def mlp_loss(model, batch):
    return F.mse_loss(model(batch[:, :6]), batch[:, 6:])


def check_fsdp(rank, world, *, small=False, steps=3, compiled=False, optimizer="adamw",
               global_batch=4):
    """fully_shard on a tpu mesh trains like one process on the global batch: the global
    loss each step and every parameter at the end. The model: a 2-layer TinyLM, or with
    ``small`` the MLP."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Shard
    from torchtpu_eager.storage_ops import storage_bytes
    torch.set_float32_matmul_precision("highest")
    mesh = init_device_mesh("tpu", (world,))
    torch.manual_seed(0)
    ref = MLP() if small else TinyLM()
    loss_of = mlp_loss if small else lm_loss
    model = copy.deepcopy(ref).to("tpu")
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    weight = model.blocks[0][0].weight if small else model.blocks[0].qkv.weight
    assert isinstance(weight, DTensor) and weight.placements == (Shard(0),), type(weight)
    assert weight.to_local().device.type == "tpu"
    rows = weight.shape[0]
    assert tuple(weight.to_local().shape) == (rows // world, weight.shape[1]), weight.shape
    make = {"adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2),
            "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1)}[optimizer]
    opt, ref_opt = make(model.parameters()), make(ref.parameters())
    run = torch.compile(model, backend="torchtpu") if compiled else model
    g = torch.Generator().manual_seed(11)
    per_rank = global_batch // world
    for step in range(steps):
        if small:
            batch = torch.randn(global_batch, 9, generator=g)
        else:
            batch = torch.randint(0, VOCAB, (global_batch, SEQ + 1), generator=g)
        loss = loss_of(run, batch[rank * per_rank:(rank + 1) * per_rank].to("tpu"))
        loss.backward()
        opt.step()
        opt.zero_grad()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss, op=dist.ReduceOp.AVG)  # the mean over the global batch
        ref_loss = loss_of(ref, batch)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        same(global_loss, ref_loss.detach(), f"FSDP2 step {step} global loss", atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert isinstance(p, DTensor) and p.to_local().device.type == "tpu", name
        same(p.full_tensor(), q.detach(), f"FSDP2 parameter {name}", atol=2e-5)
    if compiled:  # the blocks' compute ran as torchtpu graphs, with no op sent to the host
        import torchtpu_compile
        from torch._dynamo.utils import counters
        assert counters["stats"]["unique_graphs"] >= 1, dict(counters["stats"])
        assert not torchtpu_compile.stats()["fallback_ops"], torchtpu_compile.stats()
    # After forward and backward each block's unsharded parameters were freed in place.
    group = model.blocks[0]._get_fsdp_state()._fsdp_param_group
    for fsdp_param in group.fsdp_params:
        for t in fsdp_param.all_gather_outputs:
            assert storage_bytes(t) == 0, f"{fsdp_param}: unsharded storage not freed"
