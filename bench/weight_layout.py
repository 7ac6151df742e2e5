"""What PyTorch's weight layout costs XLA CPU's matmul: the MLP forward's own program, three ways.

``nn.Linear`` keeps its weight as (out, in) and computes ``x @ W.T``: the graph holds
``permute(W, [1, 0])`` then ``mm``, and XLA gets a dot contracting W's last dimension. This
script takes the StableHLO our builder makes for ``compile_path.mlp()`` (4 x Linear(1024, 1024),
batch 64, fp32 "highest") and runs, interleaved in one process:

- ``as built``: the program as the compile path runs it, on W (out, in);
- ``pre-transposed``: the same program with the transposes removed, fed W^T (in, out) made once
  on the host (what a cached transposed copy of each resident weight would buy);
- ``input layout {0,1}``: the pre-transposed program whose weight parameters declare the
  column-major layout (``mhlo.layout_mode``), i.e. W's own bytes with no host transpose. XLA
  keeps that layout at the boundary and inserts a physical transpose (``copy``) of each weight
  before its dot, at every call; the script counts those copies in the optimized HLO.

Reported per variant: wall time per call (median and 10th percentile of the rounds) and the
process's CPU time per call (every thread; what other processes' load moves least), with the
machine's load. ``--realtime`` (root only) runs the timed loop with every thread of this
process at SCHED_FIFO priority 1, so that on a loaded machine it sees the CPUs as if idle (other
processes wait meanwhile: a few seconds). Not part of ``run_all``.

Example::

    .venv/bin/python bench/weight_layout.py --rounds 30
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import OtherLoad  # noqa: E402
from compile_path import PRECISION, mlp  # noqa: E402

_TRANSPOSE = re.compile(r"^\s*(%\w+) = stablehlo\.transpose (%arg\d+), dims = \[1, 0\] : "
                        r"\(tensor<(\d+)x(\d+)x(\w+)>\)")


class _Recorded:
    """A built program that keeps the arguments of its first call (the bench's inputs)."""

    def __init__(self, program):
        self.program, self.args = program, None

    def __call__(self, args, *rest):
        if self.args is None:
            self.args = list(args)
        return self.program(args, *rest)


def mlp_program():
    """(the MLP forward's ``Program`` as the compile path builds it, its arguments)."""
    from torchtpu_compile.program import runner
    built = []
    original = runner.build_program

    def recording(gm, **options):
        built.append(_Recorded(original(gm, **options)))
        return built[-1]

    model, x = mlp()
    runner.build_program = recording
    try:
        with torch.no_grad():
            torch.compile(model, backend="torchtpu")(x)
    finally:
        runner.build_program = original
    [recorded] = built
    return recorded.program, recorded.args


def pre_transposed(text: str) -> tuple[str, list[int]]:
    """``text`` with every ``transpose(%argN, [1, 0])`` removed and %argN taking the transposed
    shape; the argument numbers so changed. Only for arguments whose one use is that transpose."""
    lines, renamed, args = [], {}, []
    for line in text.splitlines():
        match = _TRANSPOSE.match(line)
        # two mentions: the signature and the transpose
        if match and len(re.findall(re.escape(match.group(2)) + r"\b", text)) == 2:
            value, arg, rows, cols, dtype = match.groups()
            renamed[value] = arg
            args.append(int(arg[4:]))
            text_type = f"{arg}: tensor<{rows}x{cols}x{dtype}>"
            lines = [ln.replace(text_type, f"{arg}: tensor<{cols}x{rows}x{dtype}>") for ln in lines]
            continue
        for value, arg in renamed.items():
            line = re.sub(re.escape(value) + r"\b", arg, line)
        lines.append(line)
    return "\n".join(lines), args


def with_input_layout(text: str, args: list[int], layout: str = "{0,1}") -> str:
    """``text`` whose arguments ``args`` declare ``layout`` (XLA's minor-to-major order)."""
    def mark(match):
        return f'{match.group(0)} {{mhlo.layout_mode = "{layout}"}}'
    for number in args:
        text = re.sub(rf"%arg{number}: tensor<[^>]*>", mark, text, count=1)
    return text


@contextlib.contextmanager
def _realtime(on: bool):
    """Every thread of this process at SCHED_FIFO priority 1 meanwhile (``on``), then back."""
    def every_thread(policy, priority):
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setscheduler(int(tid), policy, os.sched_param(priority))
            except ProcessLookupError:  # a thread that ended meanwhile
                pass
    if on:
        try:
            every_thread(os.SCHED_FIFO, 1)
        except PermissionError as exc:
            every_thread(os.SCHED_OTHER, 0)
            raise SystemExit(f"--realtime needs root (CAP_SYS_NICE): {exc}") from exc
    try:
        yield
    finally:
        if on:
            every_thread(os.SCHED_OTHER, 0)


def _copies(program) -> int:
    hlo = program.executable.loaded.hlo_modules()[0].to_string()
    return len(re.findall(r"= \S+ copy\(", hlo))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=5, help="calls per round and variant")
    parser.add_argument("--realtime", action="store_true",
                        help="time at SCHED_FIFO priority (root; module doc)")
    options = parser.parse_args()
    torch.set_float32_matmul_precision(PRECISION)

    import jax
    from jax.experimental.layout import Format, Layout
    from jax.sharding import SingleDeviceSharding

    from torchtpu_compile.program.run import compile_program
    from torchtpu_compile.runtime.client import get_client
    from torchtpu_compile.runtime.transfer import to_buffer

    program, args = mlp_program()
    text = program.lowered.text
    inputs = [args[i] for i in program.arg_indices]
    transposed_text, weights = pre_transposed(text)
    layout_text = with_input_layout(transposed_text, weights)
    built = compile_program(text, precision=PRECISION, name="as built")
    pre = compile_program(transposed_text, precision=PRECISION, name="pre-transposed")
    laid = compile_program(layout_text, precision=PRECISION, name="input layout {0,1}")

    def plain(tensors):
        return [to_buffer(t.detach()) for t in tensors]

    column_major = Format(Layout(major_to_minor=(1, 0)),
                          SingleDeviceSharding(get_client().device))
    transposed = [t.detach().t().contiguous() if i in weights else t
                  for i, t in enumerate(inputs)]
    variants = {
        "as built": (built, plain(inputs)),
        "pre-transposed": (pre, plain(transposed)),
        "input layout {0,1}": (laid, [jax.device_put(t.numpy(), column_major) if i in weights
                                      else to_buffer(t) for i, t in
                                      enumerate(t.detach() for t in transposed)]),
    }
    reference = torch.from_dlpack(built.run(variants["as built"][1])[0]).clone()
    for name, (prog, buffers) in variants.items():
        out = torch.from_dlpack(prog.run(buffers)[0])
        assert torch.equal(out, reference), f"{name} computes another result"

    wall = {name: [] for name in variants}
    cpu = {name: [] for name in variants}
    with OtherLoad() as load, _realtime(options.realtime):
        for _ in range(options.rounds):
            for name, (prog, buffers) in variants.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                for _ in range(options.calls):
                    prog.run(buffers)[0].block_until_ready()
                wall[name].append((time.perf_counter() - start) / options.calls)
                cpu[name].append((time.process_time() - start_cpu) / options.calls)
    print(f"MLP forward program (64 x 1024, 4 x Linear(1024, 1024), fp32 {PRECISION!r}); "
          f"{options.rounds} rounds x {options.calls} calls, interleaved; others' CPU share "
          f"{load.share if load.share is not None else float('nan'):.0%}, load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
          f"{', timed at SCHED_FIFO priority' if options.realtime else ''}")
    print(f"{'variant':<20} {'wall median':>12} {'wall p10':>9} {'cpu/call':>9} "
          f"{'cpu vs built':>12} {'copies':>7}")
    base = statistics.median(cpu["as built"])
    for name, (prog, _) in variants.items():
        p10 = sorted(wall[name])[len(wall[name]) // 10]
        print(f"{name:<20} {statistics.median(wall[name]) * 1e3:>9.2f} ms {p10 * 1e3:>6.2f} ms "
              f"{statistics.median(cpu[name]) * 1e3:>6.2f} ms "
              f"{statistics.median(cpu[name]) / base:>11.2f}x {_copies(prog):>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
