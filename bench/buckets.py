"""Bounded dynamism: a causal decoder called with 40 random lengths in 1..512.

Reports, for the whole 40-call run (first compile included), the wall time and the number of
compiles of torchtpu with buckets, torchtpu with buckets off (``TORCHTPU_BUCKETS=0``: one
compile per length) and Inductor with ``dynamic=None`` (automatic dynamic), plus eager.

Each contender runs in a fresh process with empty compile caches, since in-process and disk
caches would otherwise answer; the runs are sequential, so compare ratios with the others' CPU
column in mind. Run one by hand with ``python bench/buckets.py --child torchtpu 40``.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import OtherLoad, result, run_fresh_child  # noqa: E402

CONTENDERS = ("eager", "inductor", "torchtpu", "torchtpu_no_buckets")


def lengths(count: int) -> list[int]:
    """The benchmark's sequence lengths: ``count`` draws from 1..512, fixed seed."""
    rng = random.Random(0)
    return [rng.randint(1, 512) for _ in range(count)]


def _child(contender: str, count: int) -> dict:
    import torch
    sys.path.insert(0, os.path.dirname(HERE))  # the repository root: tests.support
    from tests.support.dynamic_models import Decoder

    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(0)
    model = Decoder().eval()
    if contender == "eager":
        run = model
    elif contender == "inductor":
        run = torch.compile(model, backend="inductor", dynamic=None)
    else:
        import torchtpu_compile
        torchtpu_compile.config.buckets = contender == "torchtpu"
        run = torch.compile(model, backend="torchtpu")
    inputs = [torch.randint(0, 64, (2, n)) for n in lengths(count)]
    worst = 0.0
    start = time.perf_counter()
    with torch.no_grad():
        outputs = [run(ids) for ids in inputs]
    seconds = time.perf_counter() - start
    with torch.no_grad():
        for ids, out in zip(inputs, outputs):
            worst = max(worst, (out - model(ids)).abs().max().item())
    report = {"seconds": seconds, "max_abs_error": worst}
    if contender.startswith("torchtpu"):
        import torchtpu_compile
        stats = torchtpu_compile.stats()
        report["compiles"] = sum(g["compiles"] for g in stats["graphs"].values())
        report["max_compiles_per_graph"] = max(g["compiles"] for g in stats["graphs"].values())
        report["xla_compiles"] = stats["graphs_compiled"]
        report["padding_waste_pct"] = stats["buckets"]["padding_waste_pct"]
    elif contender == "inductor":
        from torch._dynamo.utils import counters
        report["compiles"] = int(counters["stats"]["unique_graphs"])
    return report


def _run_child(contender: str, count: int) -> dict:
    return run_fresh_child(__file__, contender, contender, count)


def bench_buckets(quick: bool) -> list[dict]:
    """Rows for run_all.py: the 40-length run (12 lengths with --quick)."""
    count = 12 if quick else 40
    reports = {}
    with OtherLoad() as load:
        for contender in CONTENDERS:
            reports[contender] = _run_child(contender, count)
    times = {c: reports[c]["seconds"] for c in ("eager", "inductor", "torchtpu")}
    tpu, off, ind = reports["torchtpu"], reports["torchtpu_no_buckets"], reports["inductor"]
    notes = [
        f"{count} lengths in 1..512, batch 2, whole run incl. compiles",
        f"compiles: torchtpu {tpu['compiles']} (max {tpu['max_compiles_per_graph']} per graph, "
        f"{tpu['xla_compiles']} XLA), buckets off {off['compiles']}, "
        f"Inductor {ind['compiles']} graphs",
        f"torchtpu buckets / buckets off: {tpu['seconds'] / off['seconds']:.2f}x time "
        f"({off['seconds']:.1f} s off); padding waste {tpu['padding_waste_pct']}%",
        f"max abs error vs eager: torchtpu {tpu['max_abs_error']:.1e}, "
        f"off {off['max_abs_error']:.1e}, Inductor {ind['max_abs_error']:.1e}",
    ]
    return [result(f"decoder, {count} random lengths", times, notes=notes,
                   others_cpu=load.share)]


BENCHMARKS = {"buckets": bench_buckets}


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2], int(sys.argv[3]))))
    else:
        for row in bench_buckets("--quick" in sys.argv):
            print(json.dumps(row, indent=2))
