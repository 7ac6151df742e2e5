"""What torchtpu's profiler spans cost: per compiled call and per eager op, profiler off and on.

Off the profiler each span site pays one attribute check (``torchtpu_compile/profiling.py``):
the measure that does not depend on the machine's load is the number of Python function calls
one compiled call or one eager op makes (``sys.setprofile``), which this prints so that it can
be compared with the code before the spans (run the script on that checkout: it only uses
public entry points). Times are medians of interleaved rounds (``common.interleaved``), profiler
off and on (``torch.profiler.profile``, CPU activity), on the one-op graph ``x + 1``.

Usage::

    .venv/bin/python bench/profiling.py            # or: bench/run_all.py --only profiling
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import fmt_time, interleaved, result  # noqa: E402


def python_calls(fn, repeat: int = 50) -> float:
    """Python-level calls (functions and builtins) per call of ``fn``, averaged."""
    fn()
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(tracer)
    try:
        for _ in range(repeat):
            fn()
    finally:
        sys.setprofile(None)
    return count / repeat


def _cases():
    x = torch.randn(8)
    compiled = torch.compile(lambda t: t + 1, backend="torchtpu")
    compiled(x)
    y = torch.randn(8).to("tpu")
    z = y + 1
    z.cpu()
    return {"compiled call": lambda: compiled(x), "eager op": lambda: y + 1}


def run(quick: bool = False) -> list:
    from torch.profiler import ProfilerActivity, profile
    cases = _cases()
    rounds = 20 if quick else 200
    rows = []
    for name, fn in cases.items():
        calls = python_calls(fn)
        off, load = interleaved({"off": fn}, rounds=rounds, inner=10)
        with profile(activities=[ProfilerActivity.CPU]):
            on, _ = interleaved({"on": fn}, rounds=max(rounds // 4, 5), inner=10)
        rows.append(result(f"profiling: {name}", {"torchtpu": off["off"]}, notes=[
            f"profiler off {fmt_time(off['off'])}, on {fmt_time(on['on'])} "
            f"({on['on'] / off['off']:.1f}x); {calls:.0f} Python calls per call, profiler off"],
            others_cpu=load, status="info"))
    return rows


BENCHMARKS = {"profiling": run}


def main() -> None:
    for row in run(quick="--quick" in sys.argv):
        print(row["name"], "|", "; ".join(row["notes"]))


if __name__ == "__main__":
    main()
