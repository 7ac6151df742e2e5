"""torchtpu in PyTorch's own tools: spans in ``torch.profiler``, artifacts in ``TORCH_TRACE``.

Spans. Each place where torchtpu spends time opens one span, named ``torchtpu::<what>`` (as
ATen's are ``aten::<op>``), so that ``prof.key_averages()`` and the exported Chrome trace show
them next to PyTorch's own events. Off the profiler a site pays one check, the attribute
PyTorch keeps for the same purpose (``torch.autograd.profiler._is_profiler_enabled``, which
Inductor and Dynamo read too); a site reads it through ``TORCH_PROFILER`` and opens its span
only when it is set::

    if TORCH_PROFILER._is_profiler_enabled:
        with span("torchtpu::upload", bytes=array.nbytes):
            ...

The names (``SPANS``) follow ``stats()``: a program's run is ``torchtpu::run <name>`` with the
name ``stats()["graphs"]`` and the logs use; the stages of a compile are those
``stats()`` times (``lowering_seconds``, ``xla_compile_seconds``). With the profiler on, a
program's execution span waits for its results (``executed``): on the asynchronous CPU client,
and on TPU, the device work ends after the launch returns, and a span that closed at launch
would show none of it. Span arguments (bytes, reasons) show in the exported trace with
``record_shapes=True``.

Device side. ``DeviceEvents`` records XLA's own events (``jax.profiler``) and the device
memory timeline next to PyTorch's profiler, and merges both into the Chrome trace it exported.

Artifacts. ``trace_artifact`` puts a JSON or text artifact into PyTorch's structured trace
(``TORCH_TRACE=<dir>``), under the compile id Dynamo is compiling (none for the eager device),
where ``tlparse`` lists it with Dynamo's own; ``python -m torchtpu_compile.report`` reads them
back (``ARTIFACTS`` names them).

Example::

    with torch.profiler.profile() as prof:
        compiled(x)
    print(prof.key_averages().table())     # torchtpu::backend_compile, torchtpu::run graph_0/...
"""
from __future__ import annotations

import collections
import contextlib
import json
import re
import threading
import time

import torch
from torch.autograd import profiler as TORCH_PROFILER  # noqa: N812 (PyTorch's module, as named)

_RecordFunctionFast = torch._C._profiler._RecordFunctionFast
_local = threading.local()  # .inner: the next checked site is the one a helper calls

#: The spans torchtpu opens (a ``<name>`` after the prefix where there is one).
SPANS = {
    "torchtpu::backend_compile": "the Dynamo backend, one graph Dynamo hands it",
    "torchtpu::aot_autograd": "aot_autograd inside it: functionalization, the partition",
    "torchtpu::build <name>": "the one builder, one program (lowering and compile inside)",
    "torchtpu::lowering": "FX to StableHLO (torch-mlir), on a lowering cache miss",
    "torchtpu::xla_compile": "PJRT compile, on an executable cache miss",
    "torchtpu::cache <cache>": "a cache lookup, holding the next span",
    "torchtpu::cache <cache> <level>": "where it hit (process, disk, remote) or 'miss'",
    "torchtpu::upload": "host memory to a PJRT buffer (bytes)",
    "torchtpu::download": "a PJRT buffer to host memory (bytes)",
    "torchtpu::run <name>": "one program call: inputs, execution, outputs",
    "torchtpu::execute": "launch to completion of one executable (waited for)",
    "torchtpu::eager <op>": "one op on the eager tpu device",
    "torchtpu::fused_graph": "defer-and-fuse: one recorded graph run as one program",
    "torchtpu::fused_op_by_op": "defer-and-fuse: a recording not compiled yet, run op by op",
    "torchtpu::fallback <op>": "an op run in eager PyTorch on the host (reason)",
    "torchtpu::collective <op>": "a tpu_dist collective (bytes, transport)",
}

#: The artifacts torchtpu puts in TORCH_TRACE, by name.
ARTIFACTS = {
    "torchtpu_program": "one built program: name, precision, seconds by stage, cache "
                        "levels hit, StableHLO size and fingerprint",
    "torchtpu_stablehlo": "its StableHLO text (a path to a file when large)",
    "torchtpu_fallbacks": "ops of a graph run in eager PyTorch, with reasons",
    "torchtpu_bucket": "a bucket decision: dims, real sizes, bucket sizes, padding",
}

#: StableHLO longer than this goes to a file next to the trace; the artifact holds its path.
INLINE_STABLEHLO_CHARS = 1 << 20


def span(name: str, **args):
    """A profiler span ``name`` (a context manager); ``args`` (str, int, float, bool) are shown
    with it in the Chrome trace. Open it only where ``TORCH_PROFILER._is_profiler_enabled``:
    the check is the site's, so that a profiler-off call pays nothing more.

    Example::

        if TORCH_PROFILER._is_profiler_enabled:
            with span("torchtpu::upload", bytes=4096):
                ...
    """
    return _RecordFunctionFast(name, (), args) if args else _RecordFunctionFast(name)


_OFF = contextlib.nullcontext()


def spanning(name: str, **args):
    """``span(name, **args)`` when the profiler is on, else a context that does nothing: for
    sites off the hot path (compiles, cache lookups), where one more call costs nothing.

    Example::

        with spanning("torchtpu::xla_compile"):
            loaded = client.compile_and_load(...)
    """
    if not TORCH_PROFILER._is_profiler_enabled:
        # Checked first: read as `a if args else (b if on else off)`, a span with arguments
        # was made (and entered) with the profiler off too: defer-and-fuse's every run.
        return _OFF
    return _RecordFunctionFast(name, (), args) if args else _RecordFunctionFast(name)


def reentered() -> bool:
    """Whether this call is the one ``around`` or ``executed`` makes (once: it is reset).

    A hot site checks the profiler, then this; it then runs its own body, without a second
    copy of it or a call more when the profiler is off (module doc)::

        def upload(tensor, device):
            if TORCH_PROFILER._is_profiler_enabled and not reentered():
                return around("torchtpu::upload", upload, tensor, device, bytes=tensor.nbytes)
            ...
    """
    if getattr(_local, "inner", False):
        _local.inner = False
        return True
    return False


def around(name: str, call, *call_args, **args):
    """``call(*call_args)`` inside span ``name`` (``args``: its arguments; see ``reentered``)."""
    with _RecordFunctionFast(name, (), args) if args else _RecordFunctionFast(name):
        _local.inner = True
        return call(*call_args)


def executed(run, buffers: list, **args) -> list:
    """``run(buffers)``'s results, in a ``torchtpu::execute`` span that ends when they are
    ready (module doc): what the device took, not just the launch (see ``reentered``).

    Example::

        outputs = executed(executable.run, buffers)
    """
    with _RecordFunctionFast("torchtpu::execute", (), args) if args else \
            _RecordFunctionFast("torchtpu::execute"):
        _local.inner = True
        results = run(buffers)
        for buffer in results:
            buffer.block_until_ready()
    return results


#: What XLA names its work: thunks after their HLO instructions (lowercase: "dot.3",
#: "broadcast_add_fusion", "wrapped_reduce-precision"), and its thunk executor.
_XLA_WORK = re.compile(r"[a-z][\w.\-]*$|ThunkExecutor::")


def _run_inline(events: list) -> list:
    """XLA's work among a caller thread's events: the CPU client run synchronously
    (``config.cpu_dispatch``) executes a program on the thread that called it, inside PJRT's
    ``ExecuteHelper`` span, next to PJRT's own bookkeeping (buffer handling, Python reference
    collection), which is not the device's work."""
    spans = [(e.start_ns, e.start_ns + e.duration_ns) for e in events
             if "ExecuteHelper" in e.name]
    return [e for e in events if _XLA_WORK.match(e.name) and
            any(begin <= e.start_ns <= end for begin, end in spans)]


class DeviceEvents:
    """XLA's own events (``jax.profiler``'s session: the PJRT client's execution threads, or
    the calling thread where the CPU client runs programs there) and
    the device memory figures (``runtime/memory.py``: bytes of live PJRT buffers, at each
    allocation and free), recorded while the context is open, for ``merge_into`` a Chrome
    trace PyTorch exported. (``profile_memory=True`` also gets each buffer as a tpu
    ``[memory]`` event, from C++: ``runtime/memory.py``, ``csrc/native.cpp``.)

    PyTorch's profiler has no hook for another profiler's events, so the device side is a
    second session next to it; both clocks are the wall clock, and the merged events land
    inside the ``torchtpu::execute`` span of the program that ran them. Their names are XLA's
    (fusions, thunks), on one track per XLA thread, under the process "XLA"; each names, in
    its arguments, the program whose run span it falls in (as ``stats()["graphs"]`` does).

    Example::

        with torch.profiler.profile() as prof, DeviceEvents() as xla:
            step()
        prof.export_chrome_trace("trace.json")
        xla.merge_into("trace.json")
    """

    #: Markers of XLA's thread pools and of an op's end, not work: left out.
    SKIPPED = ("ThreadpoolListener::", "end: ")

    def __enter__(self):
        from jax._src.lib import _profiler
        options = _profiler.ProfileOptions()
        options.python_tracer_level = 0  # PyTorch's profiler has the Python side
        options.host_tracer_level = 2
        self._session = _profiler.ProfilerSession(options)
        self._xspace = None
        _memory_samples.clear()
        return self

    def __exit__(self, *exc) -> None:
        self._xspace = self._session.stop()

    def events(self) -> list:
        """(thread name, name, start ns since the epoch, duration ns) of XLA's events."""
        from jax._src.profiler import ProfileData
        data = ProfileData.from_serialized_xspace(self._xspace)
        start = 0
        for plane in data.planes:
            start = dict(plane.stats).get("profile_start_time", start)
        found = []
        for plane in data.planes:
            for line in plane.lines:
                events = [e for e in line.events
                          if e.duration_ns > 0 and not e.name.startswith(self.SKIPPED)]
                if not line.name.startswith("tf_XLA"):
                    events = _run_inline(events)
                found += [(line.name, e.name, start + e.start_ns, e.duration_ns)
                          for e in events]
        return found

    def merge_into(self, chrome_trace: str) -> int:
        """Add XLA's events to ``chrome_trace`` (a file ``export_chrome_trace`` wrote);
        returns how many were added."""
        with open(chrome_trace) as f:
            trace = json.load(f)
        base_us = trace.get("baseTimeNanoseconds", 0) / 1000
        runs = sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"][len("torchtpu::run "):])
                      for e in trace["traceEvents"]
                      if e.get("ph") == "X" and e.get("name", "").startswith("torchtpu::run "))
        threads = {}
        added = []
        for thread, name, start_ns, duration_ns in self.events():
            tid = threads.setdefault(thread, len(threads) + 1)
            ts, dur = start_ns / 1000 - base_us, duration_ns / 1000
            # The innermost run span around it: the last to start among those holding it.
            program = next((run for start, end, run in reversed(runs)
                            if start <= ts and ts + dur <= end), None)
            added.append({"ph": "X", "cat": "xla", "name": name, "pid": "XLA", "tid": tid,
                          "ts": ts, "dur": dur, "args": {"program": program}})
        added += [{"ph": "M", "name": "thread_name", "pid": "XLA", "tid": tid,
                   "args": {"name": thread}} for thread, tid in threads.items()]
        added += [{"ph": "C", "name": "tpu memory", "pid": "XLA", "ts": ns / 1000 - base_us,
                   "args": {"allocated bytes": allocated}}
                  for ns, allocated in list(_memory_samples)]
        trace["traceEvents"] += added
        with open(chrome_trace, "w") as f:
            json.dump(trace, f)
        return len(added) - len(threads)


# (wall-clock ns, live device bytes) at each allocation and free while the profiler runs.
_memory_samples: collections.deque = collections.deque(maxlen=1 << 20)


def memory_sample(allocated: int) -> None:
    """Note the live device bytes now (``runtime/memory.py``, with the profiler on)."""
    _memory_samples.append((time.time_ns(), allocated))


def tracing() -> bool:
    """Whether PyTorch's structured trace is being written (``TORCH_TRACE`` set)."""
    from torch._logging._internal import trace_log
    return bool(trace_log.handlers)


def trace_artifact(name: str, payload, encoding: str = "json") -> None:
    """Write ``payload`` (a JSON-able value, or text with ``encoding="string"``) to the
    structured trace as artifact ``name`` (one of ``ARTIFACTS``), if it is being written.
    ``payload`` may be a function giving it: only called when the trace is on.

    Example::

        trace_artifact("torchtpu_fallbacks", lambda: {"graph": name, "ops": ops})
    """
    if not tracing():
        return
    from torch._logging import trace_structured

    def body():
        value = payload() if callable(payload) else payload
        return value if encoding == "string" else json.dumps(value, sort_keys=True)

    trace_structured("artifact", metadata_fn=lambda: {"name": name, "encoding": encoding},
                     payload_fn=body)


class BuildTrace:
    """One program build, for the ``torchtpu_program`` artifact: what the compile counters
    moved by while it ran (seconds by stage, cache levels hit), and the StableHLO it made.

    Example::

        trace = BuildTrace("graph_0/forward", "highest") if tracing() else None
        program = build(...)
        if trace is not None:
            trace.finish(program)
    """

    def __init__(self, name: str, precision: str):
        self.name, self.precision = name, precision
        self.start = time.perf_counter()
        self.before = _compile_figures()

    def finish(self, program) -> None:
        seconds = time.perf_counter() - self.start
        after = _compile_figures()
        lowered = getattr(program, "lowered", None)
        record = {
            "name": self.name, "precision": self.precision, "kind": type(program).__name__,
            "seconds": {"total": seconds, **{stage: after[stage] - self.before[stage]
                                             for stage in _STAGES}},
            "cache_hits": {cache: {level: after["caches"][cache][level]
                                   - self.before["caches"][cache][level]
                                   for level in after["caches"][cache]}
                           for cache in after["caches"]},
        }
        if lowered is not None:
            record["stablehlo_chars"] = len(lowered.text)
            record["fingerprint"] = lowered.fingerprint
            trace_artifact("torchtpu_stablehlo", lambda: _stablehlo_payload(self.name, lowered),
                           encoding="string")
        trace_artifact("torchtpu_program", record)


_STAGES = ("lowering_seconds", "xla_compile_seconds")


def _compile_figures() -> dict:
    """The compile counters a build moves: its stages' seconds, and hits and misses by level
    of the lowering and executable caches ("miss": looked up, no level had it)."""
    from .counters import stats
    snap = stats()
    caches = {}
    for cache in ("lowering", "executable"):
        levels = snap["caches"].get(cache, {})
        caches[cache] = {level: counts.get("hits", 0) for level, counts in levels.items()
                         if level != "all"}
        caches[cache]["miss"] = levels.get("all", {}).get("misses", 0)
    return {**{stage: snap[stage] for stage in _STAGES}, "caches": caches}


def _stablehlo_payload(name: str, lowered) -> str:
    """The module's text, or where it was written (next to the trace) when it is large."""
    text = lowered.text
    if len(text) <= INLINE_STABLEHLO_CHARS:
        return text
    import os
    folder = os.path.join(trace_folder() or ".", "torchtpu_stablehlo")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{lowered.fingerprint[:16]}.mlir")
    with open(path, "w") as out:
        out.write(text)
    return f"// {name}: {len(text)} characters of StableHLO, written to {path}\n"


def trace_folder() -> str | None:
    """The folder the structured trace is written to, or None (a file of another kind)."""
    import os

    from torch._logging._internal import trace_log
    for handler in trace_log.handlers:
        folder = getattr(handler, "root_dir", None)
        if folder:
            return folder
        path = getattr(handler, "baseFilename", None)
        if path:
            return os.path.dirname(path)
    return None
