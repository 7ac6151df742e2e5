"""The cache above the StableHLO: aot_autograd's result per Dynamo graph, across processes.

AOT tracing and decomposition is the largest part of a first call after Dynamo's own tracing,
and the executable cache does not save it. PyTorch's ``AOTAutogradCache``
already knows how to key a Dynamo graph safely and how to rebuild aot_autograd's runtime
wrappers (input mutations, aliased outputs, the autograd.Function of a training graph) from a
pickled entry; it also accepts a backend whose compiled graphs are picklable
``OutputCode`` objects ("bundled" entries). We use it as it is, with two things of our own:

- ``RunnerOutputCode``: a ``GraphRunner`` as an ``OutputCode``. It pickles the aot_autograd graph
  (through torch's ``GraphPickler``), the graph's name and its resident inputs; on load it builds
  a new ``GraphRunner``, whose StableHLO comes from the lowering cache (``lower/cache.py``) and
  whose executable comes from the executable cache. Nothing is traced again.
- the storage: torch's cache talks to a "remote cache" object; ours (``_StoreAdapter``) keeps the
  entries at our three levels (process, ``config.cache_dir``, ``config.remote_cache``), framed
  and checked like every entry, and adds to torch's key what torch cannot know: our decomposition
  table, partitioner and runner code (by source digest), torch-mlir and jaxlib versions, and the
  values of tensors the Dynamo graph holds.

What the key covers, then: the Dynamo graph's code, the shape, stride, dtype, device and
requires_grad of every input, which inputs are parameters (static), grad mode, autocast and
deterministic-algorithm state, torch's relevant configs and version (all from torch), plus the
above. Matmul precision is not in it on purpose: the runner lowers per precision at call time,
and the lowering and executable caches key on precision.

Example::

    with graph_cache.scope(dynamo_gm) as cached:   # in the backend, around aot_autograd
        fw = graph_cache.serializable(compile_forward) if cached else compile_forward
        compiled = aot_autograd(fw_compiler=fw, ...)(dynamo_gm, example_inputs)
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import operator
import pickle
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch._inductor.output_code import OutputCode

from . import config, versions
from ._logging import log
from .kernels.jax_op import graph_fingerprint
# Our own ops (C's fmod, the index checks) must be registered before an entry whose graph
# calls them unpickles; a fresh process has not lowered anything yet. A decomposition's JAX
# functions are registered by name as the entry names them (jax_functions' resolver).
from .lower import fx_passes, index_checks  # noqa: F401
from .lower.decompositions import jax_functions  # noqa: F401
from .runtime.cache import GRAPH_FOLDER, Levels, PickledBytesCodec

_scope_lock = threading.RLock()
_build_lock = threading.RLock()
_last_entry = threading.local()

#: Our modules whose code shapes an aot_autograd result or rebuilds one from the cache.
_KEYED_SOURCES = ("backend.py", "program", "graph_cache.py", "lower")


@dataclasses.dataclass
class RunnerOutputCode(OutputCode):
    """An aot_autograd graph and the ``GraphRunner`` that runs it, in a form PyTorch's
    AOTAutogradCache can pickle into a bundled entry.

    ``lazy`` defers building the runner (lowering, XLA) to the first call. Backward graphs use
    it: the cache needs aot_autograd to hand over the backward graph when the forward is
    compiled, but a forward run under grad mode that never calls backward should not pay for
    compiling it, as it does not without the cache.

    Example::

        code = RunnerOutputCode(gm=fx_graph_module, name="graph_0/forward")
        outputs = code([x, weight])
    """

    gm: Any = None
    name: str = ""
    resident_inputs: frozenset = frozenset()
    lazy: bool = False
    mutated_inputs: tuple = ()   # (input, output) pairs (program/donation.py)
    eager_layouts: tuple = ()    # outputs returned with eager's strides (calling_convention)
    inputs_die: bool = False     # a backward: its saved inputs are handed over (memory_split)
    _runner: Any = dataclasses.field(default=None, init=False, repr=False)
    _state: bytes | None = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self):
        # We take boxed arguments. An instance attribute, not a class one, so that wrappers
        # copying __dict__ (Dynamo's disable, around backward graphs) pass it on.
        self._boxed_call = True
        if not self.lazy:
            self._build()

    def _build(self):
        from .program import GraphRunner
        with _build_lock:
            if self._runner is None:
                # The cache entry must hold aot_autograd's graph: a warm process lowers it
                # again, and lowering a rewritten one (lower/fx_passes.py: our C fmod renamed
                # aten.remainder) gave eager's remainder where C's fmod was meant. The runner
                # rewrites a copy of the graph it is given, never the graph itself.
                self._runner = GraphRunner(self.gm, name=self.name,
                                           resident_inputs=self.resident_inputs,
                                           mutated_inputs=self.mutated_inputs,
                                           eager_layouts=self.eager_layouts,
                                           inputs_die=self.inputs_die)
        return self._runner

    def __call__(self, *args):
        return (self._runner or self._build())(*args)

    def prepare_for_serialization(self) -> None:
        # Called on a shallow copy (BundledOutputCodeLoadable.pre_save): the live one stays.
        from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache
        from torch.fx._graph_pickler import GraphPickler, Options

        if any(node.target is torch.ops.higher_order.with_effects for node in self.gm.graph.nodes):
            # An effectful op (linalg's _linalg_check_errors) takes a token input that torch's
            # EffectTokensWrapper supplies, and torch's cache loader does not put that wrapper
            # back: a loaded entry was called one input short (StopIteration).
            raise BypassAOTAutogradCache(f"torchtpu graph {self.name} has effect tokens")
        state = {"gm": self.gm, "name": self.name, "lazy": self.lazy,
                 "resident_inputs": sorted(self.resident_inputs),
                 "mutated_inputs": [list(pair) for pair in self.mutated_inputs],
                 "eager_layouts": list(self.eager_layouts), "inputs_die": self.inputs_die}
        try:
            self._state = GraphPickler.dumps(state, Options(ops_filter=None))
        except Exception as exc:  # a bypass is logged quietly by torch, then compiling goes on
            raise BypassAOTAutogradCache(f"torchtpu graph {self.name} not picklable: "
                                         f"{exc}") from exc
        self.gm = None
        self._runner = None

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        if self._state is None:
            return
        from torch._subclasses import FakeTensorMode
        from torch.fx._graph_pickler import GraphPickler
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        state = GraphPickler.loads(self._state, FakeTensorMode(shape_env=ShapeEnv()))
        self._state = None
        self.gm, self.name, self.lazy = state["gm"], state["name"], state["lazy"]
        self.resident_inputs = frozenset(state["resident_inputs"])
        self.mutated_inputs = tuple(tuple(pair) for pair in state.get("mutated_inputs", ()))
        self.eager_layouts = tuple(state.get("eager_layouts", ()))
        self.inputs_die = state.get("inputs_die", False)
        if not self.lazy:
            self._build()

    def set_triton_bundle(self, triton_bundle) -> None:
        pass  # no Triton here


def serializable(compile_graph: Callable) -> Callable:
    """Mark a compiler returning ``RunnerOutputCode`` as one whose results aot_autograd may cache.

    Example::

        fw = serializable(lambda gm, inputs: RunnerOutputCode(gm=gm, name="forward"))
    """
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

    return SerializableAOTDispatchCompiler(RunnerOutputCode, compile_graph)


def enabled() -> bool:
    """Whether this level is on: ``config.graph_cache`` and torch's caches not force-disabled."""
    return bool(config.graph_cache) and not torch.compiler.config.force_disable_caches


def _held_tensors_digest(gm: torch.fx.GraphModule) -> str | None:
    """Digest of the values of tensors the Dynamo graph holds as attributes; None if one of
    them cannot be read as bytes (then the graph is not cached).

    torch's key has only their metadata; a graph whose code is the same but whose held constant
    differs must not hit. (Dynamo lifts parameters, buffers and tensor attributes to inputs, so
    such constants are rare.)
    """
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    digest = hashlib.sha256()
    with unset_fake_temporarily():
        for node in gm.graph.nodes:
            if node.op != "get_attr":
                continue
            value = operator.attrgetter(node.target)(gm)
            if not isinstance(value, torch.Tensor) or isinstance(value, FakeTensor):
                continue
            try:
                flat = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
                digest.update(node.target.encode())
                digest.update(flat.numpy().tobytes())
            except Exception as exc:  # sparse, quantized, subclasses: not worth a wrong hit
                log.debug("graph not cached: held tensor %s unreadable (%s)", node.target, exc)
                return None
    return digest.hexdigest()


def _require_aot_entry(value) -> None:
    """Raise where ``value`` (an unpickled entry) is not an aot_autograd entry: torch unpickles
    an entry itself, but one that does not unpickle must be counted and discarded by our levels,
    not met by torch (which logs a traceback and recomputes it as a hit of ours)."""
    from torch._functorch._aot_autograd.aot_autograd_result import BundledAOTAutogradResult
    if not isinstance(value, BundledAOTAutogradResult):
        raise TypeError(f"a pickled {type(value).__name__}, not an aot_autograd entry")


# Values are torch's own pickles of its entries, kept as the bytes torch wrote.
_levels = Levels("aot_autograd", PickledBytesCodec(check=_require_aot_entry),
                 folder=GRAPH_FOLDER, events=("bypasses",))


class _StoreAdapter:
    """torch's "remote cache" interface (get/put of JSON dicts) over our cache levels."""

    def __init__(self, salt: str, specialized=lambda: False):
        self.salt = salt
        self.used_key: str | None = None  # the entry this graph hit or saved, if any
        self.served_key: str | None = None  # the entry handed to torch, if any
        self.saved = False  # whether torch saved an entry (after a miss)
        self._specialized = specialized  # () -> whether the trace fixed a float input's value

    def _key(self, key: str) -> str:
        return f"aot|{key}|{self.salt}"

    def get(self, key: str):
        payload = _levels.get(self._key(key))
        if payload is None:
            return None
        log.debug("aot_autograd cache hit (%s)", key[:16])
        self.used_key = self.served_key = self._key(key)
        return {"data": base64.b64encode(payload).decode("ascii")}

    def put(self, key: str, data: dict) -> None:
        if self._specialized():
            _levels.count_event("bypasses")
            log.debug("aot_autograd entry not saved: its trace fixed the value of a float "
                      "input, which the entry's guards cannot record")
            return
        payload = base64.b64decode(data["data"])
        _levels.put(self._key(key), payload,
                    compute_seconds=float(data.get("time_taken_ms", 0)) / 1000.0)
        self.used_key = self._key(key)
        self.saved = True


def _float_specializations():
    """``() -> bool``: whether, since this call, Dynamo's shape environment gained a guard on
    a float symbol.

    Dynamo passes a Python float it does not specialize (an optimizer's ``lr`` or ``betas``
    once a scheduler changed them) as a 0-d tensor input. Where aot_autograd's trace needs
    the float itself (``pow.Scalar(beta1, step)`` in Adam), it bakes in the value and guards
    on it, and Dynamo recompiles when it changes. torch's cache entry records guards on the
    graph's int inputs only: served to another process, an entry baked with one step's
    beta1 ran every later step with it, and no guard asked Dynamo to recompile. Such entries
    are not saved."""
    from torch._guards import TracingContext
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    context = TracingContext.try_get()
    shape_env = getattr(getattr(context, "fake_mode", None), "shape_env", None)
    if shape_env is None:
        return lambda: False
    before = len(shape_env.guards)

    def specialized() -> bool:
        return any(symbol_is_type(symbol, (SymT.FLOAT, SymT.UNBACKED_FLOAT))
                   for guard in shape_env.guards[before:]
                   for symbol in guard.expr.free_symbols)
    return specialized


def _input_aliasing(example_inputs) -> str | None:
    """Which example inputs share a storage, and where each starts in it: "" where none do;
    None where a storage cannot be told (then the graph is not cached).

    aot_autograd compiles inputs that alias and are mutated through a "synthetic base" (one
    input, the others views of it in the graph): a different result from the one for the same
    graph on separate inputs, under the same torch key. Served the separate-input entry, a
    graph that wrote ``w`` (a view of ``x``) returned values computed from ``x`` before the
    write. (Inductor reads real memory, where the write shows anyway; a program's inputs are
    values.)
    """
    from torch.multiprocessing.reductions import StorageWeakRef
    groups: dict = {}
    try:
        for i, t in enumerate(example_inputs):
            if isinstance(t, torch.Tensor):
                groups.setdefault(StorageWeakRef(t.untyped_storage()), []).append(
                    (i, t.storage_offset()))
    except Exception as exc:  # a storage torch cannot name: not worth a wrong hit
        log.debug("graph not cached: input storage unknown (%s)", exc)
        return None
    shared = sorted(g for g in groups.values() if len(g) > 1)
    return repr(shared) if shared else ""


@contextlib.contextmanager
def scope(gm: torch.fx.GraphModule, example_inputs=()):
    """Let aot_autograd, run inside this block, look up and save its result in our levels.

    The block patches torch's AOTAutogradCache storage for its duration (one Dynamo graph's
    compile; Dynamo compiles one frame at a time) and makes aot_autograd hand over backward
    graphs with the forward (``RunnerOutputCode`` still builds them on first use), so that the
    entry, forward and backward together, is saved before the block ends. Yields whether the
    cache is on for this graph.
    """
    _last_entry.key = None
    held = _held_tensors_digest(gm) if enabled() else None
    aliasing = _input_aliasing(example_inputs) if held is not None else None
    if aliasing is None:
        yield False
        return
    from torch._dynamo.utils import counters as torch_counters
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache

    salt = hashlib.sha256("|".join((
        versions.stack_versions(), versions.source_digest(*_KEYED_SOURCES),
        held, graph_fingerprint(gm)) + ((aliasing,) if aliasing else ())).encode()).hexdigest()
    adapter = _StoreAdapter(salt, _float_specializations())
    patched = {"get_remote_cache": staticmethod(lambda: adapter),
               # torch also writes every entry to its own folder; ours are in our levels only.
               "_write_to_local_cache": staticmethod(lambda key, content: None)}
    bypasses = torch_counters["aot_autograd"]["autograd_cache_bypass"]
    outcomes = _torch_outcomes(torch_counters)
    with _scope_lock, torch._functorch.config.patch(
            bundled_autograd_cache=True, enable_autograd_cache=False,
            enable_remote_autograd_cache=True, force_non_lazy_backward_lowering=True), \
            _view_replays_that_pickle():
        saved = {name: AOTAutogradCache.__dict__[name] for name in patched}
        try:
            for name, value in patched.items():
                setattr(AOTAutogradCache, name, value)
            yield True
        finally:
            for name, value in saved.items():
                setattr(AOTAutogradCache, name, value)
            _last_entry.key = adapter.used_key
    if adapter.served_key is not None and _torch_outcomes(torch_counters) == outcomes:
        # Served, yet neither a hit nor a guard miss for torch: loading it failed (torch
        # logs why and compiles instead), so it was no hit of ours either.
        # Where torch compiled and saved the graph again, the entry is a good one by now.
        reject(adapter.served_key, "torch could not load it", discard=not adapter.saved)
        if not adapter.saved:
            _last_entry.key = None
    if torch_counters["aot_autograd"]["autograd_cache_bypass"] > bypasses:
        _levels.count_event("bypasses")
        log.debug("aot_autograd cache bypassed for a graph (TORCH_LOGS=+torch._functorch "
                  "says why)")


#: ViewMeta classes whose pickled form is not the view they replay. torch 2.13's
#: ``_unsafe_view_ViewMeta`` (matmul's and linear's reshape of a 3-D result) keeps its size as a
#: reference to memory freed after tracing: live, it replays right, but pickled it writes
#: whatever that memory holds by then.
_UNPICKLABLE_VIEW_METAS = ("_unsafe_view_ViewMeta",)


@contextlib.contextmanager
def _view_replays_that_pickle():
    """Within the block, aot_autograd's metadata drops the view replay of an output aliasing
    another (``OutputAliasInfo.view_meta_sequence``) where a step of it does not pickle.

    A cached entry is the pickled metadata, and an entry written in one call is what runs.
    ``f(x, w): y = linear(x, w); return y, y.unflatten(0, (1, -1))`` on a 3-D ``x`` rebuilt
    its second output with sizes read from freed memory: "shape '[94250163632215,
    4594155876129682724, 4]' is invalid", or a segfault (fuzz seed 8141). Without the replay,
    aot_autograd rebuilds the alias from the output's recorded view of its base, as it does
    for a replay with symbolic sizes (``ViewAndMutationMeta.make_runtime_safe``, where this
    hooks in)."""
    from torch._functorch._aot_autograd.schemas import ViewAndMutationMeta

    original = ViewAndMutationMeta.make_runtime_safe

    def make_runtime_safe(meta) -> None:
        original(meta)
        for i, info in enumerate(meta.output_info):
            steps = info.view_meta_sequence.sequence if info.view_meta_sequence else ()
            if any(type(step).__name__ in _UNPICKLABLE_VIEW_METAS for step in steps):
                meta.output_info[i] = dataclasses.replace(info, view_meta_sequence=None)

    ViewAndMutationMeta.make_runtime_safe = make_runtime_safe
    try:
        yield
    finally:
        ViewAndMutationMeta.make_runtime_safe = original


def _torch_outcomes(torch_counters) -> tuple:
    """torch's counts of aot_autograd cache lookups that used an entry or rejected it by its
    guards: a served entry that moved neither did not load."""
    return (torch_counters["aot_autograd"]["autograd_cache_hit"],
            torch_counters["aot_autograd"]["autograd_cache_guard_miss"])


def reject(key: str, reason: str, discard: bool = True) -> None:
    """An entry ``level_entry`` or torch's loader got from our levels that did not load: count
    it corrupt instead of a hit and (unless it was written again meanwhile) discard it, so that
    the graph is computed again."""
    _levels.reject(key, reason, discard=discard)


def last_entry_key() -> str | None:
    """The key, in our levels, of the entry the last ``scope`` on this thread hit or saved;
    None if it did neither (a bypass, or the cache off). The Dynamo-level cache
    (``dynamo_cache.py``) records it to find the compiled graph again without tracing."""
    return getattr(_last_entry, "key", None)


def level_entry(key: str):
    """The aot_autograd entry stored under ``key`` (from ``last_entry_key``), unpickled, or
    None (also where it did not unpickle: then it is discarded and counted corrupt).

    Example::

        fn = deserialize_bundled_cache_entry(level_entry(key))
    """
    payload = _levels.get(key)
    return None if payload is None else pickle.loads(payload)  # a fresh one: torch alters it


def clear_memory() -> None:
    """Forget this process's aot_autograd entries (level 1 only)."""
    _levels.clear_memory()
