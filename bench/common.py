"""Timing helpers shared by the benchmarks.

Timings on a small shared machine drift by 15-30% over seconds and between processes, so every
comparison here is made inside one process, with the contenders run round-robin ("interleaved")
so that they see the same drift, and summarized by medians, which ignore the odd slow round.
Absolute numbers are indicative; ratios are what the benchmarks report on.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

CONTENDERS = ("eager", "inductor", "torchtpu")


def median(values) -> float:
    return statistics.median(values)


class OtherLoad:
    """The share of the machine's CPU time that other processes used while this ran.

    PyTorch's OpenMP threads spin-wait on each other: with another busy process on a 2-core
    machine, eager and Inductor slow down up to 10x while XLA's thread pool suffers far less, so
    a busy machine skews the ratios toward torchtpu. Linux only (/proc/stat); None elsewhere.

    Example::

        with OtherLoad() as load:
            run_benchmark()
        print(load.share)   # 0.02 on an idle machine
    """

    share: float | None = None

    @staticmethod
    def _busy_seconds() -> float:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
        return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait

    @staticmethod
    def _own_seconds() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the cold-compile processes
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    def __enter__(self):
        try:
            self._start = (time.perf_counter(), self._busy_seconds(), self._own_seconds())
        except OSError:
            self._start = None
        return self

    def __exit__(self, *exc):
        if self._start is not None:
            wall, busy, own = self._start
            others = (self._busy_seconds() - busy) - (self._own_seconds() - own)
            capacity = (time.perf_counter() - wall) * (os.cpu_count() or 1)
            self.share = max(0.0, others / capacity)
        return False


def run_fresh_child(script: str, label: str, *args) -> dict:
    """Run ``script --child *args`` in a fresh process with empty, private torchtpu and
    Inductor caches (no remote cache); the JSON object its last stdout line prints.

    Example::

        run_fresh_child(__file__, "torchtpu", "torchtpu", "40")
    """
    scratch = tempfile.mkdtemp(prefix="torchtpu-bench-child-")
    env = dict(os.environ, TORCHTPU_CACHE_DIR=os.path.join(scratch, "tpu"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(scratch, "inductor"))
    env.pop("TORCHTPU_REMOTE_CACHE", None)
    try:
        out = subprocess.run([sys.executable, os.path.abspath(script), "--child",
                              *map(str, args)], env=env, capture_output=True, text=True,
                             check=True)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"{label}: {exc.stderr.strip().splitlines()[-3:]}") from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def wait_for_idle(max_seconds: float, threshold: float = 0.05, window: float = 2.0) -> bool:
    """Wait until other processes use under ``threshold`` of the CPUs over ``window`` seconds.

    On a shared machine this keeps a benchmark from starting in the middle of someone else's
    test run; it gives up (returns False) after ``max_seconds``.
    """
    deadline = time.monotonic() + max_seconds
    while True:
        with OtherLoad() as load:
            time.sleep(window)
        if load.share is None or load.share < threshold:
            return True
        if time.monotonic() >= deadline:
            return False


def interleaved(fns: dict[str, Callable[[], object]], *, rounds: int, inner: int = 1,
                warmup: int = 2) -> tuple[dict[str, float], float | None]:
    """Median seconds per call of each callable, sampled in interleaved rounds, and the CPU
    share other processes took meanwhile (see ``OtherLoad``).

    Each round times ``inner`` back-to-back calls of every callable; the starting callable
    rotates between rounds so that none always runs first (right after another's cache
    pollution or at the start of a drift).
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    with OtherLoad() as load:
        for r in range(rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                fn = fns[name]
                start = time.perf_counter()
                for _ in range(inner):
                    fn()
                samples[name].append((time.perf_counter() - start) / inner)
    return {name: median(s) for name, s in samples.items()}, load.share


def fmt_time(seconds: float | None) -> str:
    """A duration with a unit that keeps three significant digits readable."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def result(name: str, times: dict[str, float | None], target: float | None = None,
           notes: list[str] | None = None, others_cpu: float | None = None,
           status: str | None = None) -> dict:
    """One table row: times per contender, torchtpu's ratios to the others, target verdict.

    The target applies to torchtpu/inductor (lower is better); it is reported, not asserted.
    A row whose target is another quantity (said in its notes) passes its own ``status``.
    ``others_cpu`` is the CPU share other processes took while the row was measured.
    """
    tpu = times.get("torchtpu")

    def ratio(other):
        base = times.get(other)
        return tpu / base if tpu is not None and base else None

    vs_inductor = ratio("inductor")
    if status is None and target is not None and vs_inductor is not None:
        status = "PASS" if vs_inductor <= target else "MISS"
    return {
        "name": name,
        "seconds": {c: times.get(c) for c in CONTENDERS},
        "torchtpu_vs_eager": ratio("eager"),
        "torchtpu_vs_inductor": vs_inductor,
        "target": target,
        "status": status,
        "others_cpu": others_cpu,
        "notes": notes or [],
    }


def format_table(rows: list[dict]) -> str:
    """The results as a fixed-width text table, notes listed under it."""
    header = ["benchmark", *CONTENDERS, "tpu/eager", "tpu/inductor", "others' cpu", "target",
              ""]
    def value(row, contender):  # a row with a "unit" (memory: MB) holds no durations
        v = row["seconds"][contender]
        return fmt_time(v) if "unit" not in row or v is None else f"{v:.0f} {row['unit']}"

    lines = [[r["name"], *(value(r, c) for c in CONTENDERS),
              fmt_ratio(r["torchtpu_vs_eager"]), fmt_ratio(r["torchtpu_vs_inductor"]),
              "-" if r.get("others_cpu") is None else f"{r['others_cpu']:.0%}",
              f"<= {r['target']}" if r["target"] is not None else "-", r["status"] or ""]
             for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines)]

    def fmt(cells):
        first = cells[0].ljust(widths[0])
        rest = [str(c).rjust(w) for c, w in zip(cells[1:-1], widths[1:-1])]
        return "  ".join([first, *rest, cells[-1]]).rstrip()

    out = [fmt(header), "-" * (sum(widths) + 2 * (len(widths) - 1))]
    out += [fmt(cells) for cells in lines]
    notes = [(r["name"], n) for r in rows for n in r["notes"]]
    if notes:
        out.append("")
        out += [f"  [{name}] {note}" for name, note in notes]
    return "\n".join(out)
