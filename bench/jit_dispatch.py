"""Would jaxlib's C++ dispatch (jax.jit's fast path) make a compiled call cheaper than our own
run path? The experiment behind ``bench/profile_overhead.py --jit-dispatch``.

The one-op graph ``x + 1`` (8 elements), each contender its own ``torch.compile`` of it (own
Dynamo cache entry), called in rounds whose order rotates:

- ``torchtpu (today)``: our backend as it is (``GraphRunner`` -> ``Program.__call__``:
  ``to_buffers``, ``Executable.run`` = ``execute_sharded`` + native result handlers, DLPack);
- ``torchtpu, C++ dispatch``: our backend again, its program's call replaced by one that drives
  the same compiled ``LoadedExecutable`` through jaxlib's C++ ``pjit`` fast path (``_jax.pjit``
  with a cache-miss function that hands it ``MeshExecutableFastpathData``, as ``jax.jit``
  does): the inputs checked as ``to_buffers`` checks them and passed as numpy views, one native
  call uploads, executes and wraps the results, then one DLPack export per output (outputs
  counted in the memory figures as today);
- ``torchtpu, C++ dispatch, uncounted``: the same without the memory figures' bookkeeping;
- ``torchtpu, trimmed Python``: our backend, its program's call replaced by the same checks,
  then ``batched_device_put``, ``execute_sharded``, ``consume_with_handlers`` inline;
- ``torchtpu, floor program``: our backend, its program's call replaced by the floor below
  (our backend's and ``GraphRunner``'s share above the floor);
- ``GraphRunner, floor program``: that runner behind a bare ``aot_autograd`` backend;
- ``floor: jax.jit, numpy in``: behind a bare ``aot_autograd`` backend, ``jax.jit(lambda a:
  a + 1)`` on the numpy view, no checks (what no run path of ours can beat);
- ``stub runner``: a bare ``aot_autograd`` backend returning a kept tensor (Dynamo's and
  aot_autograd's share of a call);
- Inductor's compiled call.

It prints main-thread CPU (``time.thread_time``) and wall time per call (medians of rounds
whose order rotates), each as a ratio to today's; with ``--bare`` also each replacement called
outside a compiled call. What it showed (2026-12-02, load 3-10, docs/performance.md): C++
dispatch 0.90x-0.92x of today (0.81x-0.83x without the memory figures' bookkeeping), the
trimmed path 0.98x-1.00x, even the floor as our program 0.76x-0.78x (2.6x Inductor): not
enough to take C++ dispatch as our run path.

Usage: ``.venv/bin/python bench/profile_overhead.py --jit-dispatch [--bare] [--rounds N]``
"""
from __future__ import annotations

import gc
import os
import statistics
import time
import types
import warnings

import torch


def _fresh(fn):
    """A copy of ``fn`` with its own code object: its own Dynamo cache entry."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)


def _aot_backend(run):
    """A torch.compile backend: aot_autograd around ``run(args)`` (boxed) for every graph."""
    from torch._dynamo.backends.common import aot_autograd

    def compiler(gm, example_inputs):
        def boxed(args):
            return run(args)
        boxed._boxed_call = True
        return boxed
    return aot_autograd(fw_compiler=compiler)


def _cpp_dispatch(loaded, sharding):
    """jaxlib's C++ pjit fast path around our ``LoadedExecutable``: called with numpy arrays
    (at most 32 bits: jax makes 64-bit numpy inputs 32-bit when ``jax_enable_x64`` is off) or
    jax arrays, returns the list of result arrays. The first call of each argument signature
    runs ``cache_miss`` in Python, which executes once and hands jaxlib what its fast path
    needs (as ``jax._src.pjit._get_fastpath_data`` does)."""
    from jax._src import tree_util
    from jax._src.interpreters import pxla
    from jaxlib import _jax

    def cache_miss(*args):
        buffers = [a if isinstance(a, _jax.ArrayImpl) else pxla.cc_shard_arg(a, sharding, None)
                   for a in args]
        results = loaded.execute_sharded(buffers)
        outs = [per_device[0] for per_device in results.disassemble_into_single_device_arrays()]
        count = len(args)
        fastpath = pxla.MeshExecutableFastpathData(
            loaded, tree_util.tree_structure(outs), [sharding] * count,
            [o.sharding for o in outs], [o.aval for o in outs], [True] * len(outs),
            [True] * count, [None] * count, [])
        return outs, fastpath, False

    return _jax.pjit("torchtpu_program", lambda *a: None, cache_miss, [], [],
                     pxla.JitGlobalCppCacheKeys(), tree_util.dispatch_registry,
                     pxla.cc_shard_arg, _jax.PjitFunctionCache(capacity=16))


def main(rounds: int = 9, calls: int = 2000, bare: bool = False) -> None:
    torch.set_float32_matmul_precision("highest")
    import jax
    from jax.sharding import SingleDeviceSharding
    from jaxlib import _jax

    from torchtpu_compile.program import GraphRunner, Program
    from torchtpu_compile.runtime import memory
    from torchtpu_compile.runtime.client import get_client
    from torchtpu_compile.runtime.transfer import _aval, _avals, host_tensors, to_buffer

    def add_one(x):
        return x + 1

    x = torch.randn(8)
    client = get_client()
    pjrt_device = client.device
    sharding = SingleDeviceSharding(pjrt_device)
    viewable = frozenset({torch.float32, torch.float16, torch.int32, torch.int16, torch.int8,
                          torch.uint8, torch.bool})
    tensor_type = torch.Tensor

    def host_views(program, args):
        """numpy views of the inputs and their bytes, checked as ``to_buffers`` checks."""
        views, made = [], 0
        for i in program.arg_indices:
            t = args[i]
            if not (type(t) is tensor_type and t.is_cpu and not t.requires_grad
                    and t.dtype in viewable and t.is_contiguous()):
                raise AssertionError("the experiment covers plain host inputs only")
            view = t.numpy()
            made += view.nbytes
            views.append(view)
        return views, made

    class Dispatched(Program):
        """Today's program, run through jaxlib's C++ dispatch (host inputs and results)."""

        def __call__(self, args, device=None):
            views, made = host_views(self, args)
            out = memory.track(self.dispatch(*views), self.output_bytes)
            memory.transient(made, len(views))
            return host_tensors(out, client)

    class Uncounted(Program):
        """C++ dispatch with no memory figures: what counting the buffers costs."""

        def __call__(self, args, device=None):
            views, made = host_views(self, args)
            return host_tensors(self.dispatch(*views), client)

    class Trimmed(Program):
        """Today's program, its native steps inline with no call between them."""

        def __call__(self, args, device=None):
            views, made = host_views(self, args)
            buffers = [_jax.batched_device_put(_avals.get((v.shape, v.dtype)) or _aval(v),
                                               sharding, [v], [pjrt_device], True, False,
                                               enable_x64=True) for v in views]
            results = self.executable.loaded.execute_sharded(buffers)
            out = memory.track(results.consume_with_handlers(self.handlers), self.output_bytes)
            memory.transient(made, len(views))
            return host_tensors(out, client)

    jitted = jax.jit(lambda a: a + 1)
    from_dlpack, to_dlpack = torch._C._from_dlpack, _jax.buffer_to_dlpack_managed_tensor

    class Floor(Program):
        """The floor below (``jax.jit`` on the numpy view) in place of today's program."""

        def __call__(self, args, device=None):
            return [from_dlpack(to_dlpack(jitted(args[0].numpy())))]

    def ours(kind=None):
        """Our backend's compiled ``add_one``; its program re-classed to ``kind``."""
        compiled = torch.compile(_fresh(add_one), backend="torchtpu")
        compiled(x)
        with warnings.catch_warnings():  # the heap scan touches deprecated torch attributes
            warnings.simplefilter("ignore")
            runner = next(o for o in gc.get_objects() if type(o) is GraphRunner
                          and o not in runners)
        runners.append(runner)
        program = next(iter(runner._programs.values()))
        if kind is not None:
            executable = program.executable
            executable.run([to_buffer(x)])  # its result handlers and output sizes
            program = kind.__new__(kind)
            program.__dict__.update(next(iter(runner._programs.values())).__dict__)
            program.dispatch = _cpp_dispatch(executable.loaded, sharding)
            program.handlers = executable._result_handlers
            program.output_bytes = executable._output_bytes
            runner._programs = {key: program for key in runner._programs}
            torch.testing.assert_close(compiled(x), x + 1)
            assert type(runner._programs[next(iter(runner._programs))]) is kind
        return compiled, program

    runners: list = []
    today, _ = ours()
    dispatched, dispatched_program = ours(Dispatched)
    trimmed, trimmed_program = ours(Trimmed)
    uncounted, _ = ours(Uncounted)
    inductor = torch.compile(_fresh(add_one), backend="inductor")
    inductor(x)
    floored, _ = ours(Floor)
    kept = torch.randn(8)

    def floor(args):
        view = args[0].numpy()
        args.clear()
        return [from_dlpack(to_dlpack(jitted(view)))]

    def stub(args):
        args.clear()
        return [kept]

    fns = {"inductor": lambda: inductor(x), "torchtpu (today)": lambda: today(x),
           "torchtpu, C++ dispatch": lambda: dispatched(x),
           "torchtpu, C++ dispatch, uncounted": lambda: uncounted(x),
           "torchtpu, trimmed Python": lambda: trimmed(x),
           "torchtpu, floor program": lambda: floored(x)}
    for name, run in (("GraphRunner, floor program", runners[-1]),
                      ("floor: jax.jit, numpy in", floor), ("stub runner", stub)):
        compiled = torch.compile(_fresh(add_one), backend=_aot_backend(run))
        compiled(x)
        fns[name] = lambda compiled=compiled: compiled(x)
    if bare:
        fns["  C++ dispatch, bare"] = lambda: dispatched_program([x])
        fns["  trimmed Python, bare"] = lambda: trimmed_program([x])
        fns["  floor, bare"] = lambda: floor([x])

    names = list(fns)
    cpu: dict = {name: [] for name in names}
    wall: dict = {name: [] for name in names}
    # In the grad mode the contenders were compiled in: under another, Dynamo would compile
    # each function again, with a new runner running today's program.
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            fn = fns[name]
            for _ in range(100):
                fn()
            start_cpu, start_wall = time.thread_time(), time.perf_counter()
            for _ in range(calls):
                fn()
            cpu[name].append((time.thread_time() - start_cpu) / calls)
            wall[name].append((time.perf_counter() - start_wall) / calls)
    assert len([o for o in gc.get_objects() if type(o) is GraphRunner]) == len(runners), \
        "a contender was compiled again: its program is not the one measured"
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"One-op compiled call by run path (medians of {rounds} rounds of {calls} calls; "
          f"load average {load}):")
    base = statistics.median(cpu["torchtpu (today)"])
    print(f"  {'':<34} {'main-thread CPU':>16} {'/ today':>8} {'wall':>10}")
    for name in names:
        seconds = statistics.median(cpu[name])
        print(f"  {name:<34} {seconds * 1e6:13.1f} us {seconds / base:7.2f}x "
              f"{statistics.median(wall[name]) * 1e6:7.1f} us")
