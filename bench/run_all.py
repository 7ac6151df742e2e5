"""Run every benchmark, print one table, write bench/results/latest.json.

Usage::

    .venv/bin/python bench/run_all.py            # full run (~10 minutes on 2 cores)
    .venv/bin/python bench/run_all.py --quick    # fewer iterations: a smoke test
    .venv/bin/python bench/run_all.py --only overhead

Targets are reported (PASS/MISS), never asserted: the suite measures, it does not gate.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compile_path  # noqa: E402
from common import format_table  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    parser.add_argument("--only", choices=sorted(compile_path.BENCHMARKS), action="append",
                        help="run only this benchmark (repeatable)")
    args = parser.parse_args()

    import torch
    compile_path.setup()
    load_before = os.getloadavg()[0]
    names = args.only or list(compile_path.BENCHMARKS)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"float32 matmul precision {torch.get_float32_matmul_precision()!r} for all "
          f"contenders (fp32 math){', quick' if args.quick else ''}", flush=True)

    rows, timings = [], {}
    start = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        print(f"running {name} ...", flush=True)
        rows += compile_path.BENCHMARKS[name](args.quick)
        timings[name] = round(time.perf_counter() - t0, 1)
    wall = time.perf_counter() - start
    load_after = os.getloadavg()[0]

    print()
    print(format_table(rows))
    print(f"\nwall time {wall:.0f} s ({', '.join(f'{k} {v} s' for k, v in timings.items())})")
    print(f"load average {load_before:.1f} before, {load_after:.1f} after, {os.cpu_count()} cores")
    if max(load_before, load_after) > os.cpu_count() - 0.5:
        # PyTorch's OpenMP threads spin-wait on each other; with another process on the cores,
        # eager and Inductor slow down several-fold while XLA's thread pool suffers less.
        print("WARNING: the machine was busy with other processes; eager and Inductor numbers "
              "are likely inflated (OpenMP oversubscription). Rerun on an idle machine.")

    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    path = os.path.join(HERE, "results", "latest.json")
    with open(path, "w") as f:
        json.dump({
            "when": datetime.datetime.now().isoformat(timespec="seconds"),
            "quick": args.quick,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "threads": torch.get_num_threads(),
            "matmul_precision": torch.get_float32_matmul_precision(),
            "wall_seconds": round(wall, 1),
            "load_average": [round(load_before, 2), round(load_after, 2)],
            "cpu_count": os.cpu_count(),
            "benchmark_seconds": timings,
            "results": rows,
        }, f, indent=2)
    print(f"wrote {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
