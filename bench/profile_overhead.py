"""Where torchtpu's per-call time goes, on the one-op graph ``x + 1`` (8 elements).

A second graph, ``Linear(64, 64)``, shows the cost of its parameters: resident (a buffer that
aliases the weight's memory, reused) and, for a weight whose memory PJRT cannot alias (not
64-byte aligned, as on every non-CPU platform), uploaded at each call.

Not part of run_all: a diagnostic for work on the runtime path (program/run.py, runtime/). It prints

1. the median time of each stage of one call, timed alone and interleaved (see common.py),
   from the whole compiled call down to the single PJRT pieces, with references: Inductor's
   whole call and a ``jax.jit`` call (jax's C++ dispatch: a floor for a PJRT execute), alone
   and waiting for the result (execution is asynchronous: ``Executable.run`` returns before
   the result exists, and ``to_torch`` of a fresh result waits for it);
2. the Python and C function calls of one steady call (``sys.setprofile``): the same on a busy
   machine as on an idle one;
3. main-thread CPU time per call (``time.thread_time``: other processes' load barely moves it)
   of the compiled call, the runner called directly, the compiled call around a stub runner
   (Dynamo's and aot_autograd's share), and a PJRT execute alone and interleaved with other
   work: where the compiled call's time beyond "stub + runner" goes (below);
4. one eager tpu op in strict mode (``x + 1``) by stage, main-thread CPU: PyTorch's entry
   into ``__torch_dispatch__``, our signature lookup, the input values, the execute with its
   memory bookkeeping, the new wrapper tensor, against the whole op and CPU eager;
5. the top of a cProfile of 2000 compiled calls (cProfile inflates Python-heavy stages).

What 3 showed (2026-12-02, load 8-14, medians of 7 rounds of 3000 calls): Inductor 21-28 us,
torchtpu 87-110 us, runner alone 25-35 us, stub runner 18-20 us; an ``Executable.run`` costs
7-8 us in a loop of its own and 18-24 us inside a compiled call, and about as much more when
interleaved with any other work (an Inductor call, a stub compiled call, a walk over 2 MB of
Python objects), while the Dynamo/aot frames around it slow down by some 20 us after it ran.
The "unexplained" part of a call is therefore no work of its own (keeping results alive, host
copies instead of DLPack, owned input copies, GC off and jax tracebacks off each changed
nothing, and no GC collection runs in a steady loop): it is the cold-cache cost of jaxlib's
and PJRT's native path (upload, execute, result wrapping, DLPack export) and of Dynamo's frames
evicting each other's working sets on every call. Runner microbenchmarks run hot and miss it;
only fewer native steps per call (fewer, larger jaxlib entries) remove it.

``--jit-dispatch`` runs another experiment instead (``bench/jit_dispatch.py``): the one-op call
through jaxlib's C++ dispatch (jax.jit's fast path) driving our executable, a trimmed Python run
path, a ``jax.jit`` floor and today's path, each inside a compiled call.

Usage: ``.venv/bin/python bench/profile_overhead.py [--jit-dispatch [--bare] [--rounds N]]``
"""
from __future__ import annotations

import cProfile
import gc
import os
import pstats
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import fmt_time, interleaved  # noqa: E402


def _call_counts(fn, calls: int = 20) -> tuple[float, float]:
    """Python function calls and C function calls per call of ``fn`` (after two warm calls)."""
    fn()
    fn()
    counts = {"call": 0, "c_call": 0}

    def count(frame, event, arg):
        if event in counts:
            counts[event] += 1
    sys.setprofile(count)
    try:
        for _ in range(calls):
            fn()
    finally:
        sys.setprofile(None)
    return counts["call"] / calls, counts["c_call"] / calls


def _thread_times(fns: dict, rounds: int = 7, calls: int = 3000) -> dict:
    """Median main-thread CPU seconds per call of each of ``fns``, in interleaved rounds."""
    import statistics
    import time
    samples: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(200):
                fn()
            start = time.thread_time()
            for _ in range(calls):
                fn()
            samples[name].append((time.thread_time() - start) / calls)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    torch.set_float32_matmul_precision("highest")
    import jax
    import jax.numpy as jnp

    from torchtpu_compile.lower.precision import resolve_precision
    from torchtpu_compile.program import GraphRunner, Program
    from torchtpu_compile.runtime.client import get_client
    from torchtpu_compile.runtime.transfer import host_tensors, to_buffer, to_buffers, to_torch

    def add_one(x):
        return x + 1

    x = torch.randn(8)
    compiled = torch.compile(add_one, backend="torchtpu")
    compiled(x)
    inductor = torch.compile(
        type(add_one)(add_one.__code__.replace(), add_one.__globals__), backend="inductor")
    inductor(x)
    with warnings.catch_warnings():  # the heap scan touches deprecated torch attributes
        warnings.simplefilter("ignore")
        runner = next(o for o in gc.get_objects() if type(o) is GraphRunner)
    program = next(iter(runner._programs.values()))
    assert isinstance(program, Program)
    client, plan = get_client(), program._arg_plan(1)
    exe = program.executable
    buf = to_buffer(x)
    out_buf = exe.run([buf])[0]
    linear = torch.nn.Linear(64, 64)
    compiled_linear = torch.compile(linear, backend="torchtpu")
    xl = torch.randn(4, 64)
    weight = linear.weight
    # The same values 4 bytes past a 64-byte boundary: PJRT copies it at each upload.
    unaligned = torch.empty(weight.numel() + 1)[1:].view_as(weight).copy_(weight.detach())
    unaligned = torch.nn.Parameter(unaligned)
    with torch.no_grad():
        compiled_linear(xl)
    jitted = jax.jit(lambda a: a + 1)
    xj = jnp.asarray(x.numpy())
    jitted(xj).block_until_ready()

    stages = {
        "eager x + 1": lambda: add_one(x),
        "inductor: compiled call": lambda: inductor(x),
        "torchtpu: compiled call": lambda: compiled(x),
        "  GraphRunner([x])": lambda: runner([x]),
        "    resolve_precision()": lambda: resolve_precision(get_client().platform),
        "    Program([x])": lambda: program([x]),
        "      get_client()": get_client,
        "      to_buffers([x]) (the call's inputs)": lambda: to_buffers([x], plan, client),
        "      Executable.run([buf])": lambda: exe.run([buf]),
        "      host_tensors([out])": lambda: host_tensors([out_buf], client),
        "      to_torch(out) (one alone)": lambda: to_torch(out_buf),
        "torchtpu: Linear(64,64) call": lambda: compiled_linear(xl),
        "  to_buffer(weight, resident)": lambda: to_buffer(weight, True),
        "  to_buffer(unaligned, resident)": lambda: to_buffer(unaligned, True),
        "jax.jit(x + 1) on a jax array": lambda: jitted(xj),
        "  ... and block_until_ready()": lambda: jitted(xj).block_until_ready(),
    }
    with torch.no_grad():
        times, busy = interleaved(stages, rounds=20, inner=200, warmup=50)
    print(f"median per call, stages timed alone (other processes took {busy or 0:.0%} CPU):")
    for name, seconds in times.items():
        print(f"  {name:<34} {fmt_time(seconds):>10}")

    print("\nPython and C calls per steady call (sys.setprofile; load-independent):")
    for name, fn in (("inductor: compiled call", lambda: inductor(x)),
                     ("torchtpu: compiled call", lambda: compiled(x)),
                     ("  of which GraphRunner([x])", lambda: runner([x])),
                     ("torchtpu: Linear(64,64) call", lambda: compiled_linear(xl))):
        with torch.no_grad():
            python, native = _call_counts(fn)
        print(f"  {name:<34} {python:5.0f} Python {native:5.0f} C")

    print("\nMain-thread CPU per call (time.thread_time; medians of 7 rounds of 3000 calls):")
    real_call = GraphRunner.__call__
    kept = [torch.randn(8)]

    def stubbed():
        GraphRunner.__call__ = lambda self, *a: [kept[0]]
        try:
            return compiled(x)
        finally:
            GraphRunner.__call__ = real_call
    cpu = {
        "inductor: compiled call": lambda: inductor(x),
        "torchtpu: compiled call": lambda: compiled(x),
        "  GraphRunner([x]) alone": lambda: runner([x]),
        "  compiled call, stub runner": stubbed,
        "  Executable.run alone": lambda: exe.run([buf]),
        "  Executable.run + inductor call": lambda: (exe.run([buf]), inductor(x)),
        "  Executable.run + stub call": lambda: (exe.run([buf]), stubbed()),
    }
    with torch.no_grad():
        for name, seconds in _thread_times(cpu).items():
            print(f"  {name:<34} {seconds * 1e6:7.1f} us")

    eager_op_stages()

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        compiled(x)
    profile.disable()
    print("\ncProfile, 2000 torchtpu calls, by own time:")
    pstats.Stats(profile).sort_stats("tottime").print_stats(20)


def eager_op_stages() -> None:
    """One eager tpu op in strict mode (``x + 1``, the per-op fast path) broken into stages,
    in main-thread CPU per op: PyTorch's entry into ``__torch_dispatch__`` (a wrapper subclass
    that returns a tensor it holds), a new wrapper tensor, our signature lookup, the input
    values, the execute with its memory bookkeeping, and the whole op; with CPU eager as the
    reference."""
    import torchtpu_eager  # noqa: F401  (the tpu device)
    from torchtpu_eager import dispatch
    from torchtpu_eager.storage import Storage
    from torchtpu_eager.tensor import dense_tensor

    torch.tpu.set_eager_mode("strict")
    host = torch.randn(8)
    x = host.to("tpu")
    add = torch.ops.aten.add.Tensor
    for _ in range(3):  # the first run plans, the next take the plan
        y = x + 1
    key, tensors = dispatch.signature(add, (x, 1), {})
    fast = dispatch._ops[key].fast
    assert fast, "x + 1 did not get a fast plan"
    values, folded = dispatch._input_values(tensors)
    assert folded is None, "x is a dense tensor: no read folds into the op"
    if fast.indices is not None:  # the inputs the program takes (the scalar is baked in)
        values = [values[i] for i in fast.indices]
    out = fast.run(values)[0]
    shape, dtype, numel, strides = fast.results[0]

    class Returns(torch.Tensor):  # PyTorch's entry into Python, and nothing of ours
        @staticmethod
        def __new__(cls, like):
            return torch.Tensor._make_wrapper_subclass(cls, like.shape, dtype=like.dtype)

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return held

    held = Returns(host)
    entry_only = Returns(host)
    stages = {
        "CPU eager x + 1": lambda: host + 1,
        "tpu strict x + 1 (whole op)": lambda: x + 1,
        "  __torch_dispatch__ entry, returns at once": lambda: entry_only + 1,
        "  signature() lookup": lambda: dispatch.signature(add, (x, 1), {}),
        "  input values": lambda: dispatch._input_values(tensors),
        "  execute + memory bookkeeping": lambda: fast.run(values),
        "  new wrapper tensor + Storage": lambda: dense_tensor(Storage(out, shape, dtype, numel),
                                                               shape, strides),
    }
    print("\nAn eager tpu op, strict mode (main-thread CPU per op; medians of 7 rounds of 3000):")
    for name, seconds in _thread_times(stages).items():
        print(f"  {name:<44} {seconds * 1e6:7.1f} us")
    python, native = _call_counts(lambda: x + 1)
    print(f"  Python and C calls per op: {python:.0f} Python, {native:.0f} C")
    del y


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jit-dispatch", action="store_true",
                        help="compare run paths of a compiled call (bench/jit_dispatch.py)")
    parser.add_argument("--bare", action="store_true",
                        help="with --jit-dispatch: also time each path outside a compiled call")
    parser.add_argument("--rounds", type=int, default=9, help="with --jit-dispatch")
    options = parser.parse_args()
    if options.jit_dispatch:
        import jit_dispatch
        jit_dispatch.main(rounds=options.rounds, bare=options.bare)
    else:
        main()
