"""Benchmarks of the eager "tpu" device against eager CPU PyTorch, in one process.

- per-op overhead in strict mode, on a chain of 100 small elementwise ops and on 100 ops whose
  results die at once (target <= 25 us);
- defer-and-fuse against strict, on that chain (target: at least 1.5x faster) and on a small
  MLP training step (target: at least 2x, issue 19's);
- a second run of a defer-and-fuse training loop compiles nothing new (cache hits only);
- an MLP step with ``AdamW(fused=True)`` (Hugging Face Trainer's default optimizer), strict:
  the update runs on the device (target: no host fallback).

In the table, "eager" is CPU PyTorch and "torchtpu" the tpu device in the row's mode.
"""
from __future__ import annotations

import torch

from common import interleaved, result

CHAIN_OPS = 100
TARGET_PER_OP_US = 25.0
TARGET_FUSE_SPEEDUP = 1.5
TARGET_FUSED_STEP_SPEEDUP = 2.0


def _chain(x: torch.Tensor) -> torch.Tensor:
    for _ in range(CHAIN_OPS // 4):  # four elementwise ops per turn
        x = (x * 1.0001).add(0.001).relu().sub(0.0001)
    return x


def _dropped(x: torch.Tensor) -> torch.Tensor:
    """100 ops whose results die at once (a loop's temporaries): a storage made right after
    one died takes its address, which the live-storage table must not chain under one hash."""
    for _ in range(CHAIN_OPS):
        x + 1
    return x


def _in_mode(mode: str, fn, materialize):
    def run():
        torch.tpu.set_eager_mode(mode)
        out = fn()
        materialize(out)
        return out
    return run


def _synchronized(_):
    torch.tpu.synchronize()


def bench_chain(quick: bool) -> list[dict]:
    """A chain of 100 elementwise ops on 64 floats: per-op cost, strict and fused."""
    import torchtpu_eager  # noqa: F401
    x_cpu = torch.randn(64)
    x = x_cpu.to("tpu")
    fns = {
        "cpu": lambda: _chain(x_cpu),
        "strict": _in_mode("strict", lambda: _chain(x), _synchronized),
        "fuse": _in_mode("defer_and_fuse", lambda: _chain(x), _synchronized),
        "cpu dropped": lambda: _dropped(x_cpu),
        "strict dropped": _in_mode("strict", lambda: _dropped(x), _synchronized),
    }
    times, busy = interleaved(fns, rounds=5 if quick else 15, inner=3 if quick else 10,
                              warmup=_fused_warmup())
    torch.tpu.set_eager_mode("strict")
    per_op_us = times["strict"] / CHAIN_OPS * 1e6
    speedup = times["strict"] / times["fuse"]
    dropped_us = times["strict dropped"] / CHAIN_OPS * 1e6
    return [
        result(f"eager chain of {CHAIN_OPS} ops, strict", {"eager": times["cpu"],
                                                           "torchtpu": times["strict"]},
               notes=[f"strict per-op overhead {per_op_us:.1f} us (target <= "
                      f"{TARGET_PER_OP_US:.0f} us); CPU eager {times['cpu'] / CHAIN_OPS * 1e6:.1f}"
                      f" us per op"],
               status="PASS" if per_op_us <= TARGET_PER_OP_US else "MISS", others_cpu=busy),
        result(f"eager chain of {CHAIN_OPS} ops, defer-and-fuse",
               {"eager": times["cpu"], "torchtpu": times["fuse"]},
               notes=[f"defer-and-fuse {speedup:.2f}x faster than strict on the chain "
                      f"(target >= {TARGET_FUSE_SPEEDUP})"],
               status="PASS" if speedup >= TARGET_FUSE_SPEEDUP else "MISS", others_cpu=busy),
        result(f"eager {CHAIN_OPS} ops, each result dropped, strict",
               {"eager": times["cpu dropped"], "torchtpu": times["strict dropped"]},
               notes=[f"strict per-op overhead {dropped_us:.1f} us with every result dying at "
                      f"once (target <= {TARGET_PER_OP_US:.0f} us)"],
               status="PASS" if dropped_us <= TARGET_PER_OP_US else "MISS", others_cpu=busy),
    ]


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 10))


def _train_step(model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def _fused_warmup() -> int:
    """Warm-up calls for a defer-and-fuse loop: its step is compiled at its
    ``fuse_compile_at``-th run (earlier runs go op by op), and a training step's first run
    differs from the rest (the optimizer's state appears)."""
    from torchtpu_compile import config
    return config.fuse_compile_at + 1


def bench_mlp_train(quick: bool) -> list[dict]:
    """An SGD step of a 3-layer MLP (batch 32): strict vs defer-and-fuse vs CPU eager."""
    import torchtpu_compile
    import torchtpu_eager  # noqa: F401
    x_cpu, y_cpu = torch.randn(32, 64), torch.randint(0, 10, (32,))
    x, y = x_cpu.to("tpu"), y_cpu.to("tpu")
    models = {name: _mlp() for name in ("cpu", "strict", "fuse")}
    for name in ("strict", "fuse"):
        models[name].to("tpu")
    opts = {name: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
            for name, m in models.items()}
    fns = {
        "cpu": lambda: _train_step(models["cpu"], opts["cpu"], x_cpu, y_cpu).item(),
        "strict": _in_mode("strict", lambda: _train_step(models["strict"], opts["strict"], x, y),
                           lambda loss: loss.item()),
        "fuse": _in_mode("defer_and_fuse",
                         lambda: _train_step(models["fuse"], opts["fuse"], x, y),
                         lambda loss: loss.item()),
    }
    times, busy = interleaved(fns, rounds=5 if quick else 15, inner=3 if quick else 10,
                              warmup=_fused_warmup())
    speedup = times["strict"] / times["fuse"]
    calls = _step_calls({name: fns[name] for name in ("strict", "fuse")})

    # A second run of the fused loop: everything it runs was compiled by the first.
    torch.tpu.set_eager_mode("defer_and_fuse")
    before = torchtpu_compile.stats()
    for _ in range(5):
        _train_step(models["fuse"], opts["fuse"], x, y).item()
    after = torchtpu_compile.stats()
    torch.tpu.set_eager_mode("strict")
    compiled = after["eager_programs_compiled"] - before["eager_programs_compiled"]
    runs = after["fused_graphs_run"] - before["fused_graphs_run"]
    hits = after["fused_graph_cache_hits"] - before["fused_graph_cache_hits"]
    return [
        result("MLP SGD step, strict", {"eager": times["cpu"], "torchtpu": times["strict"]},
               notes=[f"{calls['strict']:.0f} Python calls per step"], others_cpu=busy),
        result("MLP SGD step, defer-and-fuse", {"eager": times["cpu"], "torchtpu": times["fuse"]},
               notes=[f"defer-and-fuse {speedup:.2f}x faster than strict on the training step "
                      f"(target >= {TARGET_FUSED_STEP_SPEEDUP}); {calls['fuse']:.0f} Python calls "
                      f"per step"],
               status="PASS" if speedup >= TARGET_FUSED_STEP_SPEEDUP else "MISS",
               others_cpu=busy),
        result("fused training loop, second run", {},
               notes=[f"5 more steps: {compiled} programs compiled, {hits} of {runs} fused "
                      f"graphs from the cache (target: 0 compiled, all hits)"],
               status="PASS" if compiled == 0 and hits == runs > 0 else "MISS"),
    ]


def _step_calls(fns: dict) -> dict:
    """Python calls per call of each of ``fns`` (a load-independent measure of host work), the
    backward's included: it runs on the calling thread here, not on autograd's device thread,
    which the count would not see."""
    from profile_overhead import _call_counts
    with torch.autograd.set_multithreading_enabled(False):
        counts = {name: _call_counts(fn, calls=5)[0] for name, fn in fns.items()}
    torch.tpu.set_eager_mode("strict")
    return counts


def bench_fused_adamw(quick: bool) -> list[dict]:
    """An AdamW(fused=True) step of the MLP, strict, vs CPU eager's fused AdamW."""
    import torchtpu_compile
    import torchtpu_eager  # noqa: F401
    x_cpu, y_cpu = torch.randn(32, 64), torch.randint(0, 10, (32,))
    x, y = x_cpu.to("tpu"), y_cpu.to("tpu")
    models = {"cpu": _mlp(), "strict": _mlp().to("tpu")}
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True)
            for name, m in models.items()}
    fns = {
        "cpu": lambda: _train_step(models["cpu"], opts["cpu"], x_cpu, y_cpu).item(),
        "strict": lambda: _train_step(models["strict"], opts["strict"], x, y).item(),
    }
    before = torchtpu_compile.stats()["eager_fallbacks"]
    times, busy = interleaved(fns, rounds=5 if quick else 15, inner=3 if quick else 10,
                              warmup=3)
    fallbacks = torchtpu_compile.stats()["eager_fallbacks"] - before
    return [result("MLP AdamW(fused=True) step, strict",
                   {"eager": times["cpu"], "torchtpu": times["strict"]},
                   notes=[f"{fallbacks} ops ran on the host (target: 0; the step on the device)"],
                   status="PASS" if fallbacks == 0 else "MISS", others_cpu=busy)]


BENCHMARKS = {
    "eager_chain": bench_chain,
    "eager_mlp_train": bench_mlp_train,
    "eager_fused_adamw": bench_fused_adamw,
}
