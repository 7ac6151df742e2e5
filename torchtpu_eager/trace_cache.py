"""The eager device's traced graphs across processes: a second process skips the trace.

Each new op signature is traced (``programs.trace``: make_fx, functionalization, the
decompositions), 20-50 ms apiece; a first ``generate()`` of a small model meets hundreds of
signatures. The lowering and executable caches already spare a warm process torch-mlir and
XLA; this one spares it the trace: the traced graph (its FakeTensor metadata too, which the
program builder and the lowering-cache key read) is kept at the three levels of every cache
(``torchtpu_compile.runtime.cache``, as ``"eager_traces"`` in ``stats()["caches"]``).

The key is what the caller says the traced function does (``what``: the op by name and its
signature, or a view read's geometry), the examples' shapes and dtypes, the label, the
thread's index-marking mode, the default dtype and deterministic-algorithms flag, and, for the
whole process, the platform, ``config.compile_hash()``, the stack's versions and the source of
``torchtpu_compile/lower`` (the decompositions) and of this package (what the traced
functions do). A ``what`` holding anything without a stable identity across processes (a
Python callable, an object of a user class, an op outside ``aten``/``prims``) has no key: the
graph is traced, as without the cache, and not stored. An entry that does not decode is a miss
(counted corrupt, discarded).

Example::

    graph, notes = cached(("add", 1.0), examples, "aten.add.Tensor", make)
    # make() -> (OpGraph or None, picklable notes), called only on a miss
"""
from __future__ import annotations

import functools
import hashlib
import os
import time

import torch

from torchtpu_compile import config, versions
# An entry's graph may name a decomposition's JAX function, registered by name as it
# unpickles (jax_functions' resolver), in a process that has not made it yet.
from torchtpu_compile.lower.decompositions import jax_functions  # noqa: F401
from torchtpu_compile.lower.index_checks import marking_mode
from torchtpu_compile.runtime.cache import GRAPH_FOLDER, Levels

#: Namespaces whose ops are the same in every process of one stack (a user's custom op may
#: change its fake kernel between runs; its graphs are not kept).
_STABLE_NAMESPACES = frozenset({"aten", "prims"})

_SCALARS = (type(None), bool, int, float, str)
_NAMED = (torch.dtype, torch.device, torch.layout, torch.memory_format)


class _NotPortable(Exception):
    pass


def _portable(value) -> str:
    """``value`` as text that means the same in any process of this stack, or raise
    ``_NotPortable``. Types are spelled out: 1, 1.0 and True trace to different dtypes, and
    -0.0 is not 0.0 (``repr`` keeps the sign)."""
    kind = type(value)
    if kind in _SCALARS:
        return f"{kind.__name__}:{value!r}"
    if kind is tuple or kind is list:
        return f"{kind.__name__}(" + ",".join([_portable(v) for v in value]) + ")"
    if kind in _NAMED:
        return f"{kind.__name__}:{value}"
    if kind is type and value in _SCALARS:
        return f"type:{value.__name__}"
    if isinstance(value, torch._ops.OpOverload):
        if value.namespace not in _STABLE_NAMESPACES:
            raise _NotPortable(value)
        return f"op:{value.name()}"
    raise _NotPortable(kind)


@functools.cache
def _stack_context(platform: str) -> str:
    eager_dir = os.path.dirname(os.path.abspath(__file__))
    return "|".join((platform, versions.stack_versions(), versions.source_digest("lower"),
                     versions.source_digest(".", root=eager_dir)))


def key_of(what, examples: list, label: str, platform: str) -> str | None:
    """The cache key of tracing what ``what`` describes on ``examples`` (module doc), or None
    where it cannot be made portable.

    Example::

        key_of(("op:aten.add.Tensor",), [example((3,), torch.float32)] * 2, "add", "cpu")
    """
    try:
        parts = [_portable(what), repr(label)]
        for e in examples:
            if e.device.type != "meta":  # a real tensor's values could reach the trace
                return None
            parts.append(f"{e.dtype}{list(e.shape)}")
    except _NotPortable:
        return None
    parts.append(f"{marking_mode()}|{torch.get_default_dtype()}|"
                 f"{torch.are_deterministic_algorithms_enabled()}|{config.compile_hash()}")
    digest = hashlib.sha256(";".join(parts).encode()).hexdigest()
    return f"trace|{digest}|{_stack_context(platform)}"


class TraceCodec:
    """An entry: (the traced graph module or None, its label, the caller's notes), pickled by
    torch's ``GraphPickler`` (FakeTensor metadata included), loaded into a fresh fake mode.
    ``decode`` raises for a payload that is not one.

    Example::

        codec = TraceCodec()
        gm, label, notes = codec.decode(codec.encode((graph.gm, "add", None)))
    """

    def encode(self, value) -> bytes:
        from torch.fx._graph_pickler import GraphPickler, Options
        return GraphPickler.dumps(value, Options(ops_filter=None))

    def decode(self, payload: bytes):
        from torch._subclasses import FakeTensorMode
        from torch.fx._graph_pickler import GraphPickler
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        value = GraphPickler.loads(payload, FakeTensorMode(shape_env=ShapeEnv()))
        if not (isinstance(value, tuple) and len(value) == 3 and isinstance(value[1], str)
                and (value[0] is None or isinstance(value[0], torch.fx.GraphModule))):
            raise ValueError(f"not a traced graph entry: {type(value).__name__}")
        if value[0] is not None:
            value[0].recompile()  # unpickled without its generated forward
        return value


_levels = Levels("eager_traces", TraceCodec(), folder=GRAPH_FOLDER)


def cached(what, examples: list, label: str, platform: str, make):
    """``make()`` -> ``(OpGraph or None, notes)``, answered from the cache where this trace was
    kept before (the graph rebuilt from the entry). ``notes``: picklable plain data the caller
    learnt while tracing (the nesting of an op's returns); None as the graph: the trace showed
    the caller's plan does not apply (kept too, so that it is not traced again).

    Example::

        graph, shapes = cached(what, examples, label, "cpu", lambda: (trace(...), shapes))
    """
    from .programs import OpGraph
    key = key_of(what, examples, label, platform) if config.graph_cache else None
    if key is None:
        return make()
    found = _levels.get(key)
    if found is not None:
        gm, stored_label, notes = found
        return (None if gm is None else OpGraph(gm, stored_label)), notes
    start = time.perf_counter()
    graph, notes = make()
    _levels.put(key, (None if graph is None else graph.gm,
                      label if graph is None else graph.label, notes),
                compute_seconds=time.perf_counter() - start)
    return graph, notes


def clear_memory() -> None:
    """Forget this process's entries (level 1 only), as a new process has none."""
    _levels.clear_memory()
