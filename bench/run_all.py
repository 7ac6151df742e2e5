"""Run every benchmark, print one table, write bench/results/latest.json.

Usage::

    .venv/bin/python bench/run_all.py            # full run (~7-8 min on an idle 2-core machine)
    .venv/bin/python bench/run_all.py --quick    # fewer iterations: a smoke test (~2 min)
    .venv/bin/python bench/run_all.py --only overhead
    .venv/bin/python bench/run_all.py --omp-wait-policy both   # the whole run under each policy

Every contender runs under one explicit ``OMP_WAIT_POLICY`` (PASSIVE by default), printed in
the header and stored in the results. libgomp reads it once, when torch loads, so the run
happens in a child process started with it (a parent whose environment already names the
policy asked for runs in place). Under libgomp's default, torch's OpenMP workers spin after
each parallel region on the cores XLA's threads then need: a row that reads a compiled output
back with a torch op (``mlp forward, output read``) then pays milliseconds, so the policy
decides the ratio. ``both`` runs the suite under PASSIVE, then ACTIVE, and writes
``latest-<policy>.json`` for each besides ``latest.json`` (the PASSIVE run).

Before each benchmark it waits (up to --wait-idle seconds) for other processes to leave the
CPUs alone, and it reports the CPU share others took while each row was measured.

Targets are reported (PASS/MISS), never asserted: the suite measures, it does not gate.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import buckets  # noqa: E402
import compile_path  # noqa: E402
import eager_device  # noqa: E402
import generation  # noqa: E402
import memory  # noqa: E402
import migration  # noqa: E402
import profiling  # noqa: E402
import tpu_dist  # noqa: E402
from common import fmt_time, format_table, result, wait_for_idle  # noqa: E402

BENCHMARKS = {**compile_path.BENCHMARKS, **buckets.BENCHMARKS, **eager_device.BENCHMARKS,
              **tpu_dist.BENCHMARKS, **memory.BENCHMARKS, **profiling.BENCHMARKS,
              **generation.BENCHMARKS, **migration.BENCHMARKS}

#: Others' CPU share above which a row's timings are not to be trusted.
BUSY = 0.10

#: The OpenMP wait policies the suite can run every contender under (module doc).
OMP_POLICIES = ("PASSIVE", "ACTIVE")


def _under_policy(policy: str) -> int | None:
    """Run this script again in a child process with ``OMP_WAIT_POLICY=policy`` (for every
    contender alike: libgomp reads it only when torch loads); its exit status, or None where
    this process already runs under that policy."""
    if os.environ.get("OMP_WAIT_POLICY", "").upper() == policy:
        return None
    argv = [a for a in sys.argv[1:] if not a.startswith("--omp-wait-policy")]
    if "--omp-wait-policy" in sys.argv[1:]:  # "--omp-wait-policy X": drop X as well
        i = sys.argv.index("--omp-wait-policy")
        argv = sys.argv[1:i] + sys.argv[i + 2:]
    env = dict(os.environ, OMP_WAIT_POLICY=policy)
    return subprocess.run([sys.executable, os.path.abspath(__file__), *argv,
                           f"--omp-wait-policy={policy}"], env=env).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    parser.add_argument("--only", choices=sorted(BENCHMARKS), action="append",
                        help="run only this benchmark (repeatable)")
    parser.add_argument("--wait-idle", type=float, default=30.0, metavar="SECONDS",
                        help="before each benchmark, wait up to this long for other processes "
                             "to leave the CPUs idle (default 30; 0 to not wait)")
    parser.add_argument("--omp-wait-policy", choices=(*OMP_POLICIES, "BOTH"), default="PASSIVE",
                        type=str.upper,
                        help="OMP_WAIT_POLICY every contender runs under (default PASSIVE; "
                             "both: a whole run under each, see the module doc)")
    args = parser.parse_args()
    policies = OMP_POLICIES if args.omp_wait_policy == "BOTH" else (args.omp_wait_policy,)
    if len(policies) > 1 or os.environ.get("OMP_WAIT_POLICY", "").upper() != policies[0]:
        status = 0
        for policy in policies:
            print(f"=== every contender under OMP_WAIT_POLICY={policy} (child process) ===",
                  flush=True)
            status = status or _under_policy(policy) or 0
            results = os.path.join(HERE, "results")
            if len(policies) > 1 and os.path.exists(os.path.join(results, "latest.json")):
                shutil.copy(os.path.join(results, "latest.json"),
                            os.path.join(results, f"latest-{policy.lower()}.json"))
        if len(policies) > 1:  # latest.json: the default policy's run
            shutil.copy(os.path.join(HERE, "results", f"latest-{policies[0].lower()}.json"),
                        os.path.join(HERE, "results", "latest.json"))
        return status
    policy = os.environ["OMP_WAIT_POLICY"].upper()

    import torch
    compile_path.setup()
    names = args.only or list(BENCHMARKS)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"float32 matmul precision {torch.get_float32_matmul_precision()!r} for all "
          f"contenders (fp32 math), OMP_WAIT_POLICY={policy} for all contenders"
          f"{', quick' if args.quick else ''}", flush=True)

    rows, timings = [], {}
    start = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        print(f"running {name} ...", flush=True)
        if args.wait_idle > 0 and not wait_for_idle(args.wait_idle):
            print(f"  (other processes kept the CPUs busy for {args.wait_idle:.0f} s; "
                  f"running anyway)", flush=True)
        try:
            new_rows = BENCHMARKS[name](args.quick)
        except Exception as exc:  # one broken benchmark should not cost the others' numbers
            traceback.print_exc()
            new_rows = [result(name, {}, notes=[f"FAILED: {type(exc).__name__}: {exc}"[:300]])]
        for r in new_rows:  # progress, in case a later benchmark takes the run down
            print("  " + ", ".join(f"{c} {fmt_time(t)}" for c, t in r["seconds"].items()),
                  flush=True)
        rows += new_rows
        timings[name] = round(time.perf_counter() - t0, 1)
    wall = time.perf_counter() - start

    print()
    print(format_table(rows))
    print(f"\nOMP_WAIT_POLICY={policy} for every contender")
    print(f"wall time {wall:.0f} s ({', '.join(f'{k} {v} s' for k, v in timings.items())})")
    busiest = max((r["others_cpu"] or 0.0 for r in rows), default=0.0)
    if busiest > BUSY:
        print(f"WARNING: other processes used up to {busiest:.0%} of the CPUs during the run "
              f"(column others' cpu). PyTorch's OpenMP threads then slow down several-fold, far "
              f"more than XLA's: eager and Inductor times are inflated and ratios favour "
              f"torchtpu. Trust only rows under {BUSY:.0%}; rerun on an idle machine.")

    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    path = os.path.join(HERE, "results", "latest.json")
    with open(path, "w") as f:
        json.dump({
            "when": datetime.datetime.now().isoformat(timespec="seconds"),
            "quick": args.quick,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "threads": torch.get_num_threads(),
            "omp_wait_policy": policy,
            "matmul_precision": torch.get_float32_matmul_precision(),
            "wall_seconds": round(wall, 1),
            "cpu_count": os.cpu_count(),
            "benchmark_seconds": timings,
            "results": rows,
        }, f, indent=2)
    print(f"wrote {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
