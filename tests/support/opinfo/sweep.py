"""The whole OpInfo sweep, each entry in a worker process that may crash or hang without
taking the sweep down; results go to a JSON file that ``report`` turns into docs/coverage.md.

Usage (from the repository root)::

    python -m tests.support.opinfo.sweep --out build/coverage/opinfo.json          # everything
    python -m tests.support.opinfo.sweep --ops add,mul --dtypes fp32 --paths compile

A worker reads entry names, writes one JSON line when it starts an entry and one with the
result; the driver restarts a worker that died (the entry it was on becomes a ``fail`` naming
the crash) or went silent for ``--timeout`` seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time

from tests.support import python_env

DTYPES = ("fp32", "bf16", "c64")
PATHS = ("compile", "eager")


def entries(only=None) -> list:
    """Every OpInfo entry name ("op" or "op.variant"), in op_db order."""
    from torch.testing._internal.common_methods_invocations import op_db
    from .harness import entry_name
    names = [entry_name(op) for op in op_db]
    if only:
        wanted = set(only)
        missing = wanted - set(names)
        if missing:
            raise SystemExit(f"not OpInfo entries: {', '.join(sorted(missing))}")
        names = [n for n in names if n in wanted]
    return names


def _worker(jobs: list, max_samples: int) -> None:
    """Run (entry, path, dtype) jobs read as JSON from argv; one line per start and result."""
    from torch.testing._internal.common_methods_invocations import op_db

    import torchtpu_compile
    from .harness import DTYPES_BY_NAME, check, entry_name
    torchtpu_compile.config.matmul_precision = "highest"  # fp32 comparisons at fp32 tolerance
    by_name = {entry_name(op): op for op in op_db}
    for name, path, dtype in jobs:
        print(json.dumps({"start": [name, path, dtype]}), flush=True)
        result = check(by_name[name], path, DTYPES_BY_NAME[dtype], max_samples=max_samples)
        print(json.dumps({"result": result.to_json()}), flush=True)


def _crashed(job, why: str) -> dict:
    name, path, dtype = job
    return {"op": name, "path": path, "dtype": dtype, "status": "fail", "detail": why,
            "category": "", "samples": 0, "fallback_ops": {}, "seconds": 0.0}


def _run_chunk(jobs: list, max_samples: int, timeout: float, results: dict, log) -> list:
    """Run jobs in one worker; return the jobs it did not reach (after a crash or hang)."""
    env = python_env()
    cmd = [sys.executable, "-m", "tests.support.opinfo.sweep", "--worker", json.dumps(jobs),
           "--max-samples", str(max_samples)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                            text=True)
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)  # end of output: the worker exited

    threading.Thread(target=pump, daemon=True).start()
    current, last = None, time.monotonic()
    while True:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            if current is not None and time.monotonic() - last > timeout:
                proc.kill()
                proc.wait()
                results[current] = _crashed(current, f"timed out after {timeout:.0f} s")
                log(results[current])
                current = None
                break
            continue
        if line is None:
            proc.wait()
            break
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a stray print from a library
        if "start" in record:
            current, last = tuple(record["start"]), time.monotonic()
        elif "result" in record:
            r = record["result"]
            results[(r["op"], r["path"], r["dtype"])] = r
            log(r)
            current = None
    if current is not None and current not in results:
        results[current] = _crashed(current, f"worker crashed (exit status {proc.returncode})")
        log(results[current])
    return [job for job in jobs if tuple(job) not in results]


def sweep(names: list, paths=PATHS, dtypes=DTYPES, max_samples: int = 3, timeout: float = 300,
          chunk: int = 150, jobs: int = 1, log=print) -> list:
    """Check every (entry, path, dtype) in ``jobs`` parallel workers; returns the result dicts.

    Example::

        sweep(["add", "mul"], paths=("compile",), dtypes=("fp32",))
    """
    from concurrent.futures import ThreadPoolExecutor

    results: dict = {}
    pending = [[n, p, d] for d in dtypes for p in paths for n in names]
    # Fresh workers every ``chunk`` entries keep memory bounded over a long sweep; chunks are
    # interleaved so that parallel workers share the slow entries.
    chunks = [pending[i::max(1, -(-len(pending) // chunk))]
              for i in range(max(1, -(-len(pending) // chunk)))]

    def run(batch):
        while batch:
            batch = _run_chunk(batch, max_samples, timeout, results, log)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(run, chunks))
    order = {tuple(job): i for i, job in enumerate(pending)}
    return [results[k] for k in sorted(results, key=lambda k: order.get(k, 0))]


def _print_result(r: dict) -> None:
    detail = " ".join(r["detail"].split())[:150] if r["status"] != "pass" else ""
    detail = f"  {detail}" if detail else ""
    print(f"{r['status']:8} {r['path']:7} {r['dtype']} {r['op']} ({r['seconds']:.1f}s){detail}",
          flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="build/coverage/opinfo.json")
    parser.add_argument("--ops", help="comma-separated entry names (default: all)")
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--max-samples", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300, help="seconds per entry")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes at a time")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(json.loads(args.worker), args.max_samples)
        return 0
    names = entries(args.ops.split(",") if args.ops else None)
    start = time.perf_counter()
    results = sweep(names, args.paths.split(","), args.dtypes.split(","), args.max_samples,
                    args.timeout, jobs=args.jobs, log=_print_result)
    elapsed = time.perf_counter() - start
    write(args.out, results, elapsed, args.max_samples)
    print(f"{len(results)} results in {elapsed:.0f} s -> {args.out}")
    return 0


def write(path: str, results: list, seconds: float, max_samples: int) -> None:
    """The results JSON that ``report`` reads."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"seconds": seconds, "max_samples": max_samples, "results": results}, f,
                  indent=1)


if __name__ == "__main__":
    sys.exit(main())
