"""The whole OpInfo sweep, each entry in a worker process that may crash or hang without
taking the sweep down; results go to a JSON file that ``report`` turns into docs/coverage.md.

Usage (from the repository root)::

    python -m tests.support.opinfo.sweep --out build/coverage/opinfo.json          # everything
    python -m tests.support.opinfo.sweep --ops add,mul --dtypes fp32 --paths compile
    python -m tests.support.opinfo.sweep --db modules --out build/coverage/modinfo.json
    python -m tests.support.opinfo.sweep --paths fuse --dtypes fp32 --reference-inputs \
        --max-samples 10 --ops add                                # more, and harder, inputs

``--db modules`` sweeps PyTorch's ModuleInfo database (``module_db``, ``modules.py``) instead of
``op_db``, in fp32 only; ``--ops`` then names modules (``nn.LSTM``). Paths: ``compile``,
``eager`` (the tpu device in strict mode) and ``fuse`` (the tpu device in defer-and-fuse mode);
see ``paths.py``. ``--max-samples 0`` runs every sample; ``--reference-inputs`` takes OpInfo's
``reference_inputs`` (its sample inputs first, then, for many ops, more) instead.

``--chain N`` runs chains instead (``chain.py``): N samples of one entry, or of a random mix
(``mix.SEED``, ``grad.SEED`` with a backward at the end; ``--mixes M`` of each), recorded back to
back on the device with results fed into later samples, compared with eager CPU at the end::

    python -m tests.support.opinfo.sweep --chain 12 --paths fuse,eager --dtypes fp32 --mixes 40

``--errors`` runs the entries' error inputs instead of their samples (``errors.py``: where eager
CPU raises, each path must raise the same type), over the entries that have them::

    python -m tests.support.opinfo.sweep --errors            # -> build/coverage/errors-ops.json
    python -m tests.support.opinfo.sweep --errors --db modules   # -> errors-modules.json

``--unsupported-dtypes`` runs each entry's samples at every dtype its CPU claims leave out
(``unsupported.py``: eager CPU raises there, so must each path), on the compile path and the
eager device (``--paths inductor``: what Inductor does with the same inputs)::

    python -m tests.support.opinfo.sweep --unsupported-dtypes   # -> unsupported-dtypes.json

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
PATHS = ("compile", "eager", "fuse")
#: The databases a sweep can run: OpInfo (``op_db``) and ModuleInfo (``module_db``, fp32 only).
DBS = ("ops", "modules")


def entries(only=None, db: str = "ops", errors: bool = False) -> list:
    """Every entry name of ``db`` in its order: OpInfo's "op" or "op.variant", or ModuleInfo's
    "nn.Module"; with ``errors``, only those that list error inputs."""
    from .errors import has_error_inputs
    if db == "modules":
        from .modules import module_entries
        names = [n for n, info in module_entries().items()
                 if not errors or has_error_inputs(info, db)]
    else:
        from torch.testing._internal.common_methods_invocations import op_db
        from .harness import entry_name
        names = [entry_name(op) for op in op_db if not errors or has_error_inputs(op, db)]
    if only:
        wanted = set(only)
        missing = wanted - set(names)
        if missing:
            raise SystemExit(f"not {db} database entries: {', '.join(sorted(missing))}")
        names = [n for n in names if n in wanted]
    return names


def _worker(jobs: list, max_samples: int, db: str = "ops", errors: bool = False,
            reference: bool = False, chain: int = 0, unsupported: bool = False) -> None:
    """Run (entry, path, dtype) jobs read as JSON from argv; one line per start and result."""
    import torchtpu_compile
    from .harness import DTYPES_BY_NAME
    torchtpu_compile.config.matmul_precision = "highest"  # fp32 comparisons at fp32 tolerance
    if chain:
        from .chain import check_chain

        by_name = {name: name for name, _, _ in jobs}

        def check(name, path, dtype, max_samples):
            return check_chain(name, path, dtype, chain)
    elif unsupported:
        from torch.testing._internal.common_methods_invocations import op_db
        from .harness import entry_name
        from .unsupported import check_unsupported
        by_name = {entry_name(op): op for op in op_db}

        def check(op, path, dtype, max_samples):
            return check_unsupported(op, path, dtype, max_samples=max_samples)
    elif errors:
        from . import errors as error_inputs
        if db == "modules":
            from .modules import module_entries
            by_name = module_entries()
            check_one = error_inputs.check_module_errors
        else:
            from torch.testing._internal.common_methods_invocations import op_db
            from .harness import entry_name
            by_name = {entry_name(op): op for op in op_db}
            check_one = error_inputs.check_errors

        def check(entry, path, dtype, max_samples):
            return check_one(entry, path)
    elif db == "modules":
        from .modules import check_module, module_entries
        by_name = module_entries()

        def check(info, path, dtype, max_samples):
            return check_module(info, path, max_samples=max_samples)
    else:
        from torch.testing._internal.common_methods_invocations import op_db
        from .harness import check as check_op, entry_name
        by_name = {entry_name(op): op for op in op_db}

        def check(op, path, dtype, max_samples):
            return check_op(op, path, dtype, max_samples=max_samples, reference=reference)
    for name, path, dtype in jobs:
        print(json.dumps({"start": [name, path, dtype]}), flush=True)
        result = check(by_name[name], path, DTYPES_BY_NAME[dtype], max_samples=max_samples)
        print(json.dumps({"result": result.to_json()}), flush=True)


def _crashed(job, why: str) -> dict:
    name, path, dtype = job
    return {"op": name, "path": path, "dtype": dtype, "status": "fail", "detail": why,
            "category": "", "samples": 0, "fallback_ops": {}, "seconds": 0.0}


def _run_chunk(jobs: list, max_samples: int, timeout: float, results: dict, log,
               db: str = "ops", errors: bool = False, reference: bool = False,
               chain: int = 0, unsupported: bool = False) -> list:
    """Run jobs in one worker; return the jobs it did not reach (after a crash or hang)."""
    env = python_env()
    cmd = [sys.executable, "-m", "tests.support.opinfo.sweep", "--worker", json.dumps(jobs),
           "--max-samples", str(max_samples), "--db", db] + \
        (["--errors"] if errors else []) + (["--reference-inputs"] if reference else []) + \
        (["--chain", str(chain)] if chain else []) + \
        (["--unsupported-dtypes"] if unsupported else [])
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
          chunk: int = 150, jobs: int = 1, log=print, db: str = "ops",
          errors: bool = False, reference: bool = False, chain: int = 0, pairs=None,
          unsupported: bool = False) -> list:
    """Check every (entry, path, dtype) of ``db`` in ``jobs`` parallel workers; returns the
    result dicts. ``pairs`` ((entry, dtype) each), if given, replaces ``names`` x ``dtypes``.

    Example::

        sweep(["add", "mul"], paths=("compile",), dtypes=("fp32",))
        sweep(["nn.Linear"], dtypes=("fp32",), db="modules")
        sweep(["cat"], dtypes=("fp32",), errors=True)   # its error inputs
    """
    from concurrent.futures import ThreadPoolExecutor

    results: dict = {}
    pairs = pairs if pairs is not None else [(n, d) for d in dtypes for n in names]
    pending = [[n, p, d] for n, d in pairs for p in paths]
    # Fresh workers every ``chunk`` entries keep memory bounded over a long sweep; chunks are
    # interleaved so that parallel workers share the slow entries.
    chunks = [pending[i::max(1, -(-len(pending) // chunk))]
              for i in range(max(1, -(-len(pending) // chunk)))]

    def run(batch):
        while batch:
            batch = _run_chunk(batch, max_samples, timeout, results, log, db, errors,
                               reference, chain, unsupported)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(run, chunks))
    order = {tuple(job): i for i, job in enumerate(pending)}
    return [results[k] for k in sorted(results, key=lambda k: order.get(k, 0))]


def _print_result(r: dict) -> None:
    detail = " ".join(r["detail"].split())[:150] if r["status"] != "pass" else ""
    detail = f"  {detail}" if detail else ""
    if r.get("verdicts"):  # an error-input result: how many inputs got each verdict
        detail = " [" + ", ".join(f"{n} {v}" for v, n in r["verdicts"].items()) + "]" + detail
    print(f"{r['status']:8} {r['path']:7} {r['dtype']} {r['op']} ({r['seconds']:.1f}s){detail}",
          flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="results JSON (default: build/coverage/opinfo.json, "
                        "or modinfo.json with --db modules)")
    parser.add_argument("--db", choices=DBS, default="ops")
    parser.add_argument("--ops", help="comma-separated entry names (default: all)")
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--dtypes", help="comma-separated (default: all; fp32 with --db "
                        "modules)")
    parser.add_argument("--max-samples", type=int, default=3, help="samples per entry (and "
                        "training mode), 0 for all")
    parser.add_argument("--reference-inputs", action="store_true", help="OpInfo's "
                        "reference_inputs (a superset of sample_inputs for many ops) instead "
                        "of sample_inputs")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per entry")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes at a time")
    parser.add_argument("--errors", action="store_true", help="run the entries' error inputs "
                        "(errors.py): where eager CPU raises, each path must raise the same type")
    parser.add_argument("--chain", type=int, default=0, help="run chains of this many steps "
                        "(chain.py) on the device paths instead of single samples")
    parser.add_argument("--mixes", type=int, default=20, help="with --chain: mix.SEED and "
                        "grad.SEED chains, SEED 0..MIXES-1, besides one chain per entry")
    parser.add_argument("--unsupported-dtypes", action="store_true", help="run each entry's "
                        "samples at the dtypes its CPU claims leave out (unsupported.py): "
                        "where eager CPU raises, each path must raise; default paths compile "
                        "and eager, one sample each")
    parser.add_argument("--rerun", help="with --unsupported-dtypes: only the (entry, dtype) "
                        "pairs that did not pass in this results JSON (after a fix; or "
                        "--paths inductor on what failed ours)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(json.loads(args.worker), args.max_samples, args.db, args.errors,
                args.reference_inputs, args.chain, args.unsupported_dtypes)
        return 0
    if args.reference_inputs and args.db == "modules":
        parser.error("--reference-inputs is OpInfo's: ModuleInfo has no reference inputs")
    if args.unsupported_dtypes:
        return _unsupported_main(args)
    unknown = set(args.paths.split(",")) - set(PATHS)
    if unknown:
        parser.error(f"unknown paths {', '.join(sorted(unknown))}: choose from {', '.join(PATHS)}")
    modules = args.db == "modules"
    if args.chain and (modules or args.errors):
        parser.error("--chain runs OpInfo samples: not with --db modules or --errors")
    default = ("errors-modules" if modules else "errors-ops") if args.errors else \
        ("modinfo" if modules else "chains" if args.chain else "opinfo")
    args.out = args.out or f"build/coverage/{default}.json"
    # Error inputs have no dtype (OpInfo's) or are built in fp32 (ModuleInfo's): one column.
    dtypes = args.dtypes.split(",") if args.dtypes else \
        (["fp32"] if modules or args.errors else DTYPES)
    from .harness import DTYPES_BY_NAME
    unknown = [d for d in dtypes if d not in DTYPES_BY_NAME]
    if unknown:  # each worker crashed on it, reported as a crash of every entry
        parser.error(f"unknown dtype {', '.join(unknown)}: use {', '.join(DTYPES_BY_NAME)}")
    names = chain_names(args) if args.chain else \
        entries(args.ops.split(",") if args.ops else None, args.db, args.errors)
    if args.chain:  # chains run on the device only
        args.paths = ",".join(p for p in args.paths.split(",") if p != "compile")
    start = time.perf_counter()
    results = sweep(names, args.paths.split(","), dtypes, args.max_samples,
                    args.timeout, jobs=args.jobs, log=_print_result, db=args.db,
                    errors=args.errors, reference=args.reference_inputs, chain=args.chain)
    elapsed = time.perf_counter() - start
    write(args.out, results, elapsed, args.max_samples)
    print(f"{len(results)} results in {elapsed:.0f} s -> {args.out}")
    if args.errors:
        from .errors import totals
        for path, counts in totals(results).items():
            print(f"{path}: " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items())))
    return 0


def chain_names(args) -> list:
    """--chain's jobs: the entries --ops names (every entry when none), and its mix.SEED and
    grad.SEED names, or --mixes of each when --ops names none."""
    wanted = args.ops.split(",") if args.ops else []
    mixes = [n for n in wanted if n.startswith(("mix.", "grad."))]
    ops = [n for n in wanted if n not in mixes]
    if not wanted:
        mixes = [f"{kind}.{seed}" for seed in range(args.mixes) for kind in ("mix", "grad")]
    return (entries(ops or None) if ops or not wanted else []) + mixes


def _unsupported_main(args) -> int:
    """``--unsupported-dtypes``: every (entry, dtype it does not claim) on each path."""
    from torch.testing._internal.common_methods_invocations import op_db
    from .errors import totals
    from .harness import entry_name
    from .unsupported import unsupported_dtypes
    if args.db != "ops" or args.errors or args.reference_inputs:
        raise SystemExit("--unsupported-dtypes runs OpInfo's samples alone")
    args.out = args.out or "build/coverage/unsupported-dtypes.json"
    from .paths import PATHS as RUNNERS
    paths = args.paths.split(",") if args.paths != ",".join(PATHS) else ["compile", "eager"]
    if set(paths) - set(RUNNERS):
        raise SystemExit(f"unknown paths: choose from {', '.join(RUNNERS)}")
    max_samples = args.max_samples if args.max_samples != 3 else 1
    wanted = set(entries(args.ops.split(",") if args.ops else None))
    only = set(args.dtypes.split(",")) if args.dtypes else None
    pairs = [(entry_name(op), d) for op in op_db if entry_name(op) in wanted
             for d in unsupported_dtypes(op) if only is None or d in only]
    if args.rerun:
        with open(args.rerun) as f:
            failed = {(r["op"], r["dtype"]) for r in json.load(f)["results"]
                      if r["status"] not in ("pass", "skip")}
        pairs = [pair for pair in pairs if pair in failed]
    start = time.perf_counter()
    results = sweep([], paths, (), max_samples, args.timeout, jobs=args.jobs,
                    log=_print_result, pairs=pairs, unsupported=True)
    elapsed = time.perf_counter() - start
    write(args.out, results, elapsed, max_samples)
    print(f"{len(results)} results in {elapsed:.0f} s -> {args.out}")
    for path, counts in totals(results).items():
        print(f"{path}: " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items())))
    return 0


def write(path: str, results: list, seconds: float, max_samples: int) -> None:
    """The results JSON that ``report`` reads."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"seconds": seconds, "max_samples": max_samples, "results": results}, f,
                  indent=1)


if __name__ == "__main__":
    sys.exit(main())
