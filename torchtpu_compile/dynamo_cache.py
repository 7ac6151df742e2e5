"""The cache above aot_autograd: Dynamo's output per Python frame, across processes.

A warm process already finds every graph in the graph cache (``graph_cache.py``) and every
executable on disk, yet it still pays Dynamo's bytecode tracing of the model's Python code, the
larger part of a first call on transformers models. This cache keeps what that tracing produced
for a frame: the transformed bytecode, the guards, the globals it installed, and the
aot_autograd entry (in our graph cache) behind each compiled graph. A second process that calls
the same frame gets its guards rebuilt against its own live objects and runs the stored bytecode:
no tracing.

Guards are the hard part. Many of Dynamo's guards hold a value read when they were built: an
object's ``id`` (``ID_MATCH``, ``TYPE_MATCH``, ...), a constant (``CONSTANT_MATCH``), a tensor's
metadata (``TENSOR_MATCH``). Rebuilt in another process they would read the live value and pass
by construction. So, at save, each such guard gets a portable fingerprint of the value it read
(module and qualified name, plus a digest of the bytecode for functions; the value for
constants; dtype, shape, strides and so on for tensors), and at load the same source is
evaluated on the live frame and must give the same fingerprint, or the entry is a miss and the
frame is traced as usual. A guard kind we cannot fingerprint makes the frame uncacheable (counted
in ``stats()["caches"]["dynamo"]["all"]["bypasses"]``), never a looser guard. On top of that the
key holds the frame's bytecode, the torch and transformers versions, Dynamo's config and our own
source; each entry holds a checksum of the source lines of every function Dynamo inlined; and
the rebuilt guards must pass on the frame before the entry is used.

Not cached (traced as before): frames with dynamic shapes (symbolic sizes), frames that graph
break (resume functions), frames whose guards read an object only identifiable by ``id``, and
frames whose inputs share a storage (``_inputs_sharing_storage``).
A loaded entry brings the sizes its trace had seen into Dynamo's automatic-dynamic record, so a
warm process goes dynamic at the same call a cold one does (a decode loop's next length traces
the symbolic frame, not one more static frame per process).

On by default (``TORCHTPU_DYNAMO_CACHE=0`` or ``config.dynamo_cache = False`` turns it off). It
works on Dynamo internals (``ConvertFrameAssert``, ``CheckFunctionManager``, ``SerializedCode``)
that may move between torch releases, so it serves only the releases it was tested on
(``SUPPORTED_TORCH``) and only while those internals have the shape it expects: on any other
torch it stays off (one log line), and Dynamo traces every frame as usual. A damaged or
truncated entry is discarded with a warning and the frame is traced again (``runtime/cache``).

It serves the backends that ``install`` it (``backend.py`` installs it for "torchtpu"); it knows
nothing of them but their function.

Example::

    torchtpu_compile.config.dynamo_cache = True
    model = torch.compile(model, backend="torchtpu")
    model(x)            # first process: traced, saved;  a second process: loaded, not traced
"""
from __future__ import annotations

import builtins
import copy
import dataclasses
import enum
import functools
import gc
import hashlib
import importlib
import inspect
import itertools
import linecache
import pickle
import re
import sys
import threading
import time
import types
from typing import Any

import torch

from . import config, versions
from ._logging import log
from .runtime.cache import GRAPH_FOLDER, Levels, PickleCodec

_install_lock = threading.Lock()
_installed = False
_backends: list = []  # the compiler functions whose frames this cache serves
_FORMAT = 1
#: Our sources whose code shapes a Dynamo-level entry or what it points to.
_KEYED_SOURCES = ("dynamo_cache.py", "backend.py", "graph_cache.py", "dtype_support.py", "program",
                  "lower")
#: Digests of a front end's code that shapes what Dynamo makes of a frame (``keyed_by``).
_front_end_digests: set = set()


def keyed_by(digest: str) -> None:
    """Key every frame by ``digest`` too: a front end's code that changes how Dynamo traces
    (the eager device's tensor type taught to Dynamo). An entry written before an edit to it
    loaded after (a tpu tensor's comparison kept raising NameError from a stale entry).

    Example::

        keyed_by(versions.source_digest("compile_support.py", root=eager_dir))
    """
    _front_end_digests.add(digest)


#: The torch releases (``major.minor``) whose Dynamo internals this cache was written against and
#: tested on; on any other the cache stays off.
SUPPORTED_TORCH = ("2.13",)


class Unportable(Exception):
    """A value, guard or global that cannot be recognised in another process."""


def enabled() -> bool:
    """Whether this cache is on: ``config.dynamo_cache``, on a torch it supports, and the graph
    cache it points into."""
    from . import graph_cache
    return bool(getattr(config, "dynamo_cache", False)) and supported_torch() is None \
        and graph_cache.enabled()


@functools.cache
def supported_torch(version: str | None = None) -> str | None:
    """None where this cache may run on this torch (``version``: another ``torch.__version__``
    to judge), else why not: a release it was not tested on, or Dynamo internals it hooks into
    that are not there.

    Example::

        supported_torch("2.13.0+cpu")    # None
        supported_torch("2.14.0")        # "torch 2.14.0 is not one the Dynamo-level cache ..."
    """
    version = torch.__version__ if version is None else version
    release = ".".join(version.split("+")[0].split(".")[:2])
    if release not in SUPPORTED_TORCH:
        return (f"torch {version} is not one the Dynamo-level cache was tested on "
                f"({', '.join(SUPPORTED_TORCH)})")
    try:
        from torch._dynamo.convert_frame import ConvertFrameAssert
        from torch._dynamo.guards import CheckFunctionManager  # noqa: F401
        from torch._dynamo.package import SerializedCode  # noqa: F401
        parameters = list(inspect.signature(ConvertFrameAssert.__call__).parameters)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        return f"Dynamo's internals moved ({type(exc).__name__}: {exc})"
    if parameters[:5] != ["self", "frame", "cache_entry", "hooks", "frame_state"] \
            or "skip" not in parameters:
        return f"ConvertFrameAssert.__call__ takes {parameters}"
    return None


# --- portable fingerprints ----------------------------------------------------------------

_CONSTANT_TYPES = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis))
_TORCH_CONSTANT_TYPES = (torch.dtype, torch.device, torch.layout, torch.memory_format)


def code_digest(code: types.CodeType) -> str:
    """SHA-256 of what a code object does: its bytecode, constants (nested code too) and names.

    Example::

        code_digest(f.__code__) == code_digest(g.__code__)   # same source, same digest
    """
    digest = hashlib.sha256()

    def feed(c: types.CodeType) -> None:
        digest.update(repr((c.co_qualname, c.co_argcount, c.co_posonlyargcount,
                            c.co_kwonlyargcount, c.co_flags, c.co_names, c.co_varnames,
                            c.co_freevars, c.co_cellvars)).encode())
        digest.update(c.co_code)
        for const in c.co_consts:
            if isinstance(const, types.CodeType):
                feed(const)
            elif isinstance(const, frozenset):  # set order varies with string hashing
                digest.update(repr(sorted(map(repr, const))).encode())
            else:
                digest.update(repr(const).encode())

    feed(code)
    return digest.hexdigest()


def _constant(value: Any):
    if isinstance(value, _CONSTANT_TYPES):
        return ("const", type(value).__name__, repr(value))
    if isinstance(value, _TORCH_CONSTANT_TYPES):
        return ("torch", type(value).__name__, str(value))
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list, torch.Size):
        return (type(value).__name__, tuple(_describe(v) for v in value))
    if isinstance(value, (frozenset, set)):
        return (type(value).__name__, tuple(sorted(repr(_describe(v)) for v in value)))
    if isinstance(value, (slice, range)):
        return (type(value).__name__, repr(value))
    raise Unportable(f"constant of type {type(value).__qualname__}")


@functools.cache
def _class_identity(cls: type) -> tuple:
    # The name, and the bytecode of the functions the class itself defines: an edited method,
    # or a dataclass with other fields (a generated __init__), is another class.
    methods = []
    for name, member in sorted(vars(cls).items()):
        member = getattr(member, "__func__", member)
        if isinstance(member, types.FunctionType):
            methods.append((name, code_digest(member.__code__)))
    digest = hashlib.sha256(repr(methods).encode()).hexdigest()
    return ("class", cls.__module__, cls.__qualname__, digest)


def _identity(value: Any):
    if isinstance(value, types.ModuleType):
        if sys.modules.get(value.__name__) is not value:
            raise Unportable(f"module {value.__name__} is not the one imported under its name")
        return ("module", value.__name__)
    if isinstance(value, enum.Enum):
        return ("enum", _identity(type(value)), value.name)
    if isinstance(value, type):
        return _class_identity(value)
    if isinstance(value, types.FunctionType):
        return ("function", value.__module__, value.__qualname__, code_digest(value.__code__))
    if isinstance(value, types.CodeType):
        return ("code", code_digest(value))
    if isinstance(value, types.MethodType):
        return ("method", _identity(value.__func__), _identity(value.__self__))
    if isinstance(value, (staticmethod, classmethod)):
        return (type(value).__name__, _identity(value.__func__))
    if isinstance(value, property):
        return ("property", *(None if f is None else _identity(f)
                              for f in (value.fget, value.fset, value.fdel)))
    if isinstance(value, (types.BuiltinFunctionType, types.WrapperDescriptorType,
                          types.MethodDescriptorType, types.ClassMethodDescriptorType,
                          types.MethodWrapperType, types.GetSetDescriptorType,
                          types.MemberDescriptorType)):
        owner = getattr(value, "__self__", None)
        if owner is not None and not isinstance(owner, (types.ModuleType, type)):
            raise Unportable(f"builtin {value!r} bound to an instance")
        return ("builtin", type(value).__name__, getattr(value, "__module__", None),
                getattr(value, "__qualname__", getattr(value, "__name__", None)),
                None if owner is None else _identity(owner))
    if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return ("op", str(value))
    raise Unportable(f"object of type {type(value).__qualname__} has no portable identity")


def _describe(value: Any):
    """A fingerprint of ``value`` that means the same in any process, or ``Unportable``."""
    try:
        return _constant(value)
    except Unportable:
        return _identity(value)


def _tensor(value: Any):
    # (A tensor the graph holds as a constant is guarded by id instead: _fingerprint refuses.)
    if not isinstance(value, torch.Tensor):
        raise Unportable(f"TENSOR_MATCH on a {type(value).__qualname__}")
    return ("tensor", _identity(type(value)), str(value.dtype), str(value.device),
            tuple(value.shape), tuple(value.stride()), value.requires_grad,
            torch._C._dispatch_keys(value).raw_repr())


def _saved_tensors_hooks(_value: Any):
    from torch._functorch._aot_autograd.utils import (saved_tensors_hooks_are_inlineable,
                                                      top_saved_tensors_hooks)
    hooks = top_saved_tensors_hooks()
    if saved_tensors_hooks_are_inlineable(hooks):  # the guard holds their ids
        raise Unportable("inlineable saved-tensors hooks are active")
    return ("no inlineable saved-tensors hooks",)


def _partial_keywords(guard) -> dict:
    fn = guard.create_fn
    return dict(fn.keywords) if isinstance(fn, functools.partial) else {}


def _length(value: Any) -> tuple:
    # A value that has no length now (a kernel size of 2 where (2, 2) was traced) is a plain
    # miss: len() raised, and the entry was reported as unusable ("not used (TypeError)").
    try:
        return ("len", type(value).__name__, len(value))
    except TypeError:
        return ("no len", type(value).__name__)


#: Guard kinds whose builder reads the guarded value and bakes it in: the fingerprint of that
#: value, taken at save and compared at load.
_FINGERPRINTS = {
    "ID_MATCH": _identity, "CLASS_MATCH": _identity, "MODULE_MATCH": _identity,
    "BUILTIN_MATCH": _identity, "FUNCTION_MATCH": _identity, "CLOSURE_MATCH": _identity,
    "TYPE_MATCH": lambda v: _identity(type(v)),
    "CONSTANT_MATCH": _describe, "EQUALS_MATCH": _describe,
    "TENSOR_MATCH": _tensor,
    "SEQUENCE_LENGTH": _length,
    # A module's hook dict, empty when traced. Dynamo's builder emits its length check only
    # under skip_nnmodule_hook_guards=False, and then reads the length live: either way a
    # process whose module has a hook loaded an entry traced without it (the hook ignored).
    "EMPTY_NN_MODULE_HOOKS_DICT": _length,
    "DICT_KEYS_MATCH": lambda v: ("keys", tuple(_describe(k) for k in v.keys())),
    "AUTOGRAD_SAVED_TENSORS_HOOKS": _saved_tensors_hooks,
}
#: Guard kinds that check at run time against what the guard itself holds (a key, an attribute
#: name, another source) or against state Dynamo saved with the frame (grad mode, default
#: device, ...): rebuilt on live objects they still check the same thing.
_SELF_CONTAINED = frozenset({
    "GRAD_MODE", "DETERMINISTIC_ALGORITHMS", "FSDP_TRAINING_STATE", "GLOBAL_STATE",
    "TORCH_FUNCTION_STATE", "DEFAULT_DEVICE", "DUPLICATE_INPUT", "NO_TENSOR_ALIASING",
    "NOT_PRESENT_IN_GENERIC_DICT", "DICT_CONTAINS", "DICT_NOT_CONTAINS",
})


@functools.cache
def _global_module_hooks() -> frozenset:
    """The ids of torch.nn's global hook dicts (``register_module_forward_hook``, ...): module
    globals made once at import, looked up for every guard at save and at load."""
    from torch.nn.modules import module
    return frozenset(id(value) for name, value in vars(module).items()
                     if name.startswith("_global_") and name.endswith("hooks") and
                     isinstance(value, dict))


def _guard_scope(local_scope: dict, global_scope: dict) -> dict:
    scope = {"L": local_scope, "G": global_scope, "__builtins__": builtins.__dict__.copy()}
    return scope


def _guard_value(guard, scope: dict, value_cache: dict):
    from torch._dynamo.guards import _get_closure_vars
    return guard.originating_source.get_value(scope, _get_closure_vars(), value_cache)


def _fingerprint(guard, scope: dict, value_cache: dict):
    """The fingerprint of one guard on ``scope``; None for guards that need none."""
    kind = guard.create_fn_name()
    if kind in _SELF_CONTAINED:
        return None
    if kind == "HASATTR":
        attr = _partial_keywords(guard).get("attr")
        return ("hasattr", attr, hasattr(_guard_value(guard, scope, value_cache), attr))
    fingerprint = _FINGERPRINTS.get(kind)
    if fingerprint is None:
        raise Unportable(f"{kind} guard on {guard.name}")
    if kind == "AUTOGRAD_SAVED_TENSORS_HOOKS":  # process state, no source to read
        return fingerprint(None)
    if kind == "TENSOR_MATCH":
        from torch._dynamo.guards import match_on_id_for_tensor
        if match_on_id_for_tensor(guard):  # its values are baked into the compiled graph
            raise Unportable(f"tensor {guard.name} is guarded by id")
    try:
        value = _guard_value(guard, scope, value_cache)
    except Exception as exc:  # a source that no longer resolves: not the same program
        raise Unportable(f"{kind} guard on {guard.name} does not resolve: {exc}") from exc
    if id(value) in _global_module_hooks():
        # Dynamo guards torch.nn's global hook dicts by type only: their hooks, run by every
        # module call, must be the ones the entry was traced with
        if value:
            raise Unportable("global module hooks are registered")
        return (*fingerprint(value), "no global hooks")
    return fingerprint(value)


# --- the globals Dynamo installs ----------------------------------------------------------

def _portable_global(name: str, value: Any, output) -> tuple:
    """How to rebuild, in another process, a global that Dynamo installed for this frame."""
    if name.startswith("__compiled_fn"):
        key, seen = None, 0
        while key is None and value is not None and seen < 8:  # through Dynamo's wrappers
            key = getattr(value, "_torchtpu_aot_key", None)
            value, seen = getattr(value, "__wrapped__", None), seen + 1
        if key is None:
            raise Unportable(f"{name} has no aot_autograd cache entry")
        return ("compiled_fn", key)
    if name == output.name_of_builtins_dict_key_in_fglobals:
        return ("builtins_dict",)
    if name.startswith("__resume_at"):
        raise Unportable("the frame graph-breaks (resume functions are not cached)")
    return ("value", _identity(value))


def _resolve_identity(fingerprint: tuple) -> Any:
    """The live object a module/class fingerprint names (globals installed by Dynamo)."""
    kind = fingerprint[0]
    if kind == "module":
        return importlib.import_module(fingerprint[1])
    if kind in ("class", "function"):
        obj = importlib.import_module(fingerprint[1])
        for part in fingerprint[2].split("."):
            obj = getattr(obj, part)
        if _identity(obj) != fingerprint:
            raise Unportable(f"{fingerprint[1]}.{fingerprint[2]} changed")
        return obj
    if kind == "builtin" and fingerprint[2]:
        obj = importlib.import_module(fingerprint[2])
        for part in fingerprint[3].split("."):
            obj = getattr(obj, part)
        return obj
    raise Unportable(f"cannot locate a {kind} by name")


# --- save ---------------------------------------------------------------------------------

@dataclasses.dataclass
class _Entry:
    """One traced version of a frame: bytecode, guards and what the bytecode expects."""

    dynamo_code: Any                   # torch._dynamo.package.SerializedCode
    guards_state: bytes                # OutputGraphGuardsState without scopes, pickled
    fingerprints: list                 # (guard index, fingerprint)
    installed_globals: dict            # name -> how to rebuild it
    inlined_sources: list              # (filename, first line, last line, sha256)
    # Dynamo's automatic-dynamic record of the frame when it was traced: input name ->
    # the sizes seen so far (torch._dynamo.pgo.FrameStateSizeEntry). Filled by _patched_call.
    sizes_seen: dict = dataclasses.field(default_factory=dict)


def _source_lines_digest(filename: str, first: int, last: int) -> str | None:
    lines = linecache.getlines(filename)
    if not lines:
        return None
    return hashlib.sha256("".join(lines[first - 1:last - 1]).encode()).hexdigest()


def _inlined_sources(traced_code) -> list:
    sources = []
    for code in traced_code:
        if code.co_filename.startswith("<frozen "):  # part of the interpreter, in the key
            continue
        if code.co_qualname.startswith("__create_fn__."):
            # dataclasses' generated methods: covered by their class's fingerprint, which
            # holds the bytecode digest of every function in the class (_class_identity).
            continue
        if code.co_filename.startswith("<"):
            raise Unportable(f"inlined code {code.co_qualname} has no source file")
        try:
            lines, first = inspect.getsourcelines(code)
        except (OSError, TypeError) as exc:
            raise Unportable(f"no source for inlined {code.co_qualname}: {exc}") from exc
        last = first + len(lines)
        digest = _source_lines_digest(code.co_filename, first, last)
        if digest is None:
            raise Unportable(f"cannot read {code.co_filename}")
        sources.append((code.co_filename, first, last, digest))
    return sorted(set(sources))


def _portable_guards(guards) -> list:
    """The guards as picklable values: no weak references, no stacks, plain partial args."""
    from torch.utils.weak import TensorWeakRef
    portable = []
    for guard in guards:
        fn = guard.create_fn
        if isinstance(fn, functools.partial):
            # TENSOR_MATCH may hold the tensor it read; without it, the builder reads the
            # source, which at load is the live tensor (whose fingerprint was checked).
            keywords = {k: v for k, v in fn.keywords.items()
                        if not (k == "value" and isinstance(v, TensorWeakRef))}
            for arg in (*fn.args, *keywords.values()):
                if not isinstance(arg, (*_CONSTANT_TYPES, torch._guards.Source)):
                    raise Unportable(f"{guard.create_fn_name()} guard on {guard.name} holds a "
                                     f"{type(arg).__qualname__}")
            fn = functools.partial(fn.func, *fn.args, **keywords)
        portable.append(dataclasses.replace(guard, create_fn=fn, obj_weakref=None,
                                            guarded_class_weakref=None, stack=None,
                                            user_stack=None))
    return portable


def _inputs_sharing_storage(output) -> bool:
    """Whether two different tensors the frame reads share a storage (``f(z[:6], z[4:])``).

    aot_autograd rebuilds such inputs from one synthetic base at the offsets it traced, and
    Dynamo guards neither offset: an entry saved for ``z[:6], z[4:]`` passed ``z[1:7], z[3:9]``
    in a fresh process and wrote the wrong elements, where a fresh trace is right. A tensor
    read twice (tied weights) is one tensor; a view's ``._base`` is tracked beside it."""
    seen: dict = {}
    for tracked in output.tracked_fakes:
        fake = tracked.fake
        if not isinstance(fake, torch.Tensor) or tracked.source.name.endswith("._base"):
            continue
        other = seen.setdefault(fake.untyped_storage()._cdata, fake)
        if other is not fake:
            return True
    return False


def _entry_from_trace(output, out_code) -> _Entry:
    """Everything needed to skip this frame's tracing next time, or ``Unportable``."""
    from torch._dynamo.package import SerializedCode

    if output.shape_env is not None and output.shape_env.backed_var_to_val:
        raise Unportable("symbolic shapes")
    if output.torch_function_mode_stack or output.functorch_layers or \
            output.aotautograd_guards or output.export:
        raise Unportable("torch function modes, functorch layers or export")
    if _inputs_sharing_storage(output):
        raise Unportable("inputs that share a storage (overlapping views): Dynamo's guards do "
                         "not say where they overlap")
    guards = sorted((g for g in output.guards if g.create_fn_name() != "SHAPE_ENV"),
                    key=torch._guards.Guard.sort_key)
    if not guards:  # every frame has global-state guards at least: something is amiss
        raise Unportable("no guards to save")
    scope = _guard_scope(output.local_scope, output.global_scope)
    value_cache: dict = {}
    fingerprints = []
    for index, guard in enumerate(guards):
        fingerprint = _fingerprint(guard, scope, value_cache)
        if fingerprint is not None:
            fingerprints.append((index, fingerprint))
    installed = {name: _portable_global(name, output.global_scope[name], output)
                 for name in sorted(output.installed_globals)}
    # Module aliases the guards and bytecode read (G['__import_torch'], ...), and the
    # builtins dict guards on builtins go through.
    installed.update({alias: ("value", ("module", module))
                      for alias, module in output.import_sources.items()})
    if output.name_of_builtins_dict_key_in_fglobals:
        installed[output.name_of_builtins_dict_key_in_fglobals] = ("builtins_dict",)
    state = dataclasses.replace(
        output.dump_guards_state(), local_scope={}, global_scope={},
        _guards=torch._guards.GuardsSet(),
        input_source_to_sizes_strides=torch.utils._pytree.tree_map(
            int, output.input_source_to_sizes_strides))
    guards_state = pickle.dumps((state, _portable_guards(guards)))
    return _Entry(dynamo_code=SerializedCode.from_code_object(out_code),
                  guards_state=guards_state, fingerprints=fingerprints,
                  installed_globals=installed,
                  inlined_sources=_inlined_sources(output.tracing_context.traced_code))


@functools.cache
def _torch_config_digest() -> str:
    # Dynamo's and functorch's settings change what tracing produces; read once per process
    # (a changed setting in the same process is Dynamo's own business to recompile for).
    def canonical(value) -> str:  # sets and dicts print in an order that varies by process
        if isinstance(value, (set, frozenset)):
            return repr(sorted(canonical(v) for v in value))
        if isinstance(value, dict):
            return repr(sorted((canonical(k), canonical(v)) for k, v in value.items()))
        return repr(value)

    parts = [canonical(module.get_config_copy())
             for module in (torch._dynamo.config, torch._functorch.config)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def _transformers_version() -> str:
    module = sys.modules.get("transformers")
    return getattr(module, "__version__", "none")


def frame_key(code: types.CodeType) -> str:
    """The cache key of one Python frame's code: its bytecode, where it lives, and everything
    outside it that shapes what Dynamo makes of it (versions, configs, our own code).

    Example::

        frame_key(type(model).forward.__code__)
    """
    parts = (str(_FORMAT), sys.version, code.co_filename, code.co_qualname,
             str(code.co_firstlineno), code_digest(code), versions.stack_versions(),
             _transformers_version(), versions.source_digest(*_KEYED_SOURCES),
             *sorted(_front_end_digests), _torch_config_digest())
    return "dynamo|" + hashlib.sha256("|".join(parts).encode()).hexdigest()


def _require_entries(value) -> None:
    """Raise where ``value`` (an unpickled entry) is not a frame's list of entries, or where the
    guards inside one do not unpickle (the levels then discard it as corrupt)."""
    if not isinstance(value, list) or not all(isinstance(e, _Entry) for e in value):
        raise TypeError("not a list of Dynamo cache entries")
    for entry in value:
        pickle.loads(entry.guards_state)


#: A frame's entries (its latest traced versions), pickled.
_levels = Levels("dynamo", PickleCodec(check=_require_entries), folder=GRAPH_FOLDER,
                 events=("bypasses", "frames_loaded", "entries_rejected"))


def _sizes_record(frame):
    """Dynamo's automatic-dynamic record of ``frame``'s code (input name -> the sizes its
    traces saw; a size seen to change is dynamic at the next trace), made empty if none."""
    from torch._dynamo import pgo
    return pgo.get_code_state()[pgo.CodeId.make(frame.f_code, frame.closure)].automatic_dynamic


def _seed_sizes(frame, entry: _Entry) -> None:
    """Record the sizes ``entry``'s trace had seen as seen in this process too.

    Dynamo decides to trace a frame with symbolic sizes when an input's size differs from what
    earlier traces of it saw. A frame loaded from here was not traced in this process, so
    without this the next new size traces one more static version (one more compile, and one
    more entry stored, in every warm process of a decode loop) before the size goes dynamic.
    """
    if not entry.sizes_seen or not torch._dynamo.config.automatic_dynamic_shapes:
        return
    record = _sizes_record(frame)
    for name, seen in entry.sizes_seen.items():
        record[name] |= seen  # Dynamo's merge: a size that differs becomes dynamic


def _save(code: types.CodeType, entry: _Entry, seconds: float) -> None:
    key = frame_key(code)
    # Not a lookup (nothing is loaded): uncounted. A frame keeps its 8 latest versions.
    entries = (_levels.lookup(key).value or [])[-7:]
    _levels.put(key, entries + [entry], compute_seconds=seconds)


# --- load ---------------------------------------------------------------------------------

def _sources_unchanged(sources: list) -> bool:
    for filename, first, last, digest in sources:
        linecache.checkcache(filename)
        if _source_lines_digest(filename, first, last) != digest:
            log.info("torchtpu: Dynamo cache miss: %s lines %d-%d changed", filename, first,
                     last)
            return False
    return True


def _load_compiled_fn(level_key: str):
    from torch._functorch._aot_autograd.aot_autograd_result import (
        deserialize_bundled_cache_entry)

    from . import graph_cache
    # Our own ops (the index check) must be registered before a graph that calls them is
    # unpickled; a fresh process has not built a decomposition table yet.
    from .lower import index_checks  # noqa: F401
    entry = graph_cache.level_entry(level_key)
    if entry is None:
        raise Unportable("its aot_autograd entry is gone")
    if getattr(entry, "guards_expr", None):
        raise Unportable("its aot_autograd entry has symbolic guards")
    try:
        fn = deserialize_bundled_cache_entry(entry)
    except Exception as exc:
        graph_cache.reject(level_key, f"{type(exc).__name__}: {exc}")
        raise Unportable(f"its aot_autograd entry did not load ({exc})") from exc
    fn._torchtpu_aot_key = level_key
    return torch._dynamo.disable(fn, reason="do not trace Dynamo-compiled graph")


def _reserve_unique_id(name: str) -> None:
    """Move Dynamo's name counter past a name it generated in another process (such as
    ``__builtins_dict___0``), so that its next trace in this one does not pick it again."""
    from torch._dynamo import bytecode_transformation
    match = re.fullmatch(r".*_(\d+)", name)
    if match is None:
        return
    current = next(bytecode_transformation._unique_id_counter)
    bytecode_transformation._unique_id_counter = itertools.count(
        max(current, int(match.group(1)) + 1))


def _kept_from_cleanup(f_globals: dict, names: list) -> None:
    """Keep ``names`` of ``f_globals`` when the code that installed them dies: a loaded entry
    reuses them. That code may be dropped already (``torch._dynamo.reset()``) and wait for a
    collection, whose cleanup deleted them under the guards and bytecode loaded (a second
    compile of a transformers model: KeyError '__builtins_dict___0', logged at ERROR by
    Dynamo, and a trace again). Collecting first instead cost 0.3 s a lookup."""
    if not names:
        return
    from torch._dynamo.utils import CleanupManager
    names = set(names)
    for hooks in CleanupManager.instance.values.values():
        hooks[:] = [hook for hook in hooks if getattr(hook, "scope", None) is not f_globals
                    or getattr(hook, "name", None) not in names]


def _install_globals(entry: _Entry, f_globals: dict) -> list[str]:
    """Put the non-graph globals the bytecode and guards use into ``f_globals``; the names added."""
    from torch._dynamo.output_graph import get_builtins_dict
    added = []
    _kept_from_cleanup(f_globals, [name for name in entry.installed_globals if name in f_globals])
    for name, how in entry.installed_globals.items():
        if how[0] == "compiled_fn":
            continue
        value = get_builtins_dict(f_globals) if how[0] == "builtins_dict" \
            else _resolve_identity(how[1])
        if name in f_globals:
            if f_globals[name] is not value:
                raise Unportable(f"global {name} exists with another value")
            continue
        f_globals[name] = value
        added.append(name)
        _reserve_unique_id(name)
    return added


def _build_guards(code, entry: _Entry, frame, state, guards):
    from torch._dynamo.guards import CheckFunctionManager
    from torch._dynamo.output_graph import OutputGraphCommon
    from torch.utils._ordered_set import OrderedSet
    live = dataclasses.replace(state, local_scope=frame.f_locals, global_scope=frame.f_globals,
                               _guards=torch._guards.GuardsSet(OrderedSet(guards)),
                               skip_guards_check=False)
    try:
        manager = CheckFunctionManager(code, OutputGraphCommon(live),
                                       runtime_global_scope=frame.f_globals).guard_manager
    except AssertionError as exc:
        # Dynamo checks the guards it builds against the frame and asserts they pass; here
        # that means the stored entry was made under other global state (grad mode, ...).
        if "Guard failed on the same frame" not in str(exc):
            raise
        reason = str(exc).split("reason:")[-1].strip()
        raise Unportable(f"its guards fail on this frame ({reason})") from None
    if not manager.check(frame.f_locals):
        raise Unportable("rebuilt guards fail on this frame")
    return manager


def _name_free(f_globals: dict, name: str) -> bool:
    """Whether ``name`` is free for a graph's global. One Dynamo (or this cache) installed for
    code since dropped (``torch._dynamo.reset()``) goes when that code is garbage-collected,
    which may not have happened yet: collect once before calling the name taken."""
    if name in f_globals:
        gc.collect()
    return name not in f_globals


def _try_entry(code, entry: _Entry, frame, compile_id):
    from torch._dynamo.package import SerializedCode
    from torch._dynamo.types import GuardedCode

    if not _sources_unchanged(entry.inlined_sources):
        raise Unportable("the source of an inlined function changed")
    added = _install_globals(entry, frame.f_globals)
    try:
        state, guards = pickle.loads(entry.guards_state)
        scope = _guard_scope(frame.f_locals, frame.f_globals)
        value_cache: dict = {}
        for index, expected in entry.fingerprints:
            try:
                live = _fingerprint(guards[index], scope, value_cache)
            except Unportable:
                live = None
            if live != expected:
                log.info("torchtpu: Dynamo cache miss: %s guard on %s differs",
                         guards[index].create_fn_name(), guards[index].name)
                raise Unportable("a guarded value differs")
        graphs = [(name, how[1]) for name, how in entry.installed_globals.items()
                  if how[0] == "compiled_fn"]
        for name, _ in graphs:   # before loading a graph (lowering, XLA) that would go unused
            if not _name_free(frame.f_globals, name):
                raise Unportable(f"global {name} exists")
        compiled = {name: _load_compiled_fn(key) for name, key in graphs}
        frame.f_globals.update(compiled)
        added.extend(compiled)
        manager = _build_guards(code, entry, frame, state, guards)
    except BaseException:
        for name in added:
            frame.f_globals.pop(name, None)
        raise
    dynamo_code = SerializedCode.to_code_object(entry.dynamo_code)
    # What Dynamo records for code it generated: recompiles name the original code.
    torch._dynamo.utils.orig_code_map[dynamo_code] = code
    torch._dynamo.convert_frame.output_codes.add(dynamo_code)
    return GuardedCode(dynamo_code, manager, compile_id, "Torch-Compiled Region (cached)")


def _load(frame, frame_state):
    """A guarded code for ``frame`` from the cache, or None."""
    from torch._dynamo.convert_frame import get_compile_id
    from torch._dynamo.types import wrap_guarded_code
    from torch._dynamo.utils import chromium_event_timed, get_metrics_context
    from torch._guards import CompileContext, compile_context

    code = frame.f_code
    # Counted once we know: a stored entry whose guards fail this frame is a miss, not a hit
    # that saved seconds.
    lookup = _levels.lookup(frame_key(code))
    entries = lookup.value or []
    if not entries:
        _levels.count(lookup, used=False)
        return None
    # Taking an id advances the frame's compile counter; a miss gives it back below, so the
    # trace that follows gets the id Dynamo alone would give it ([0/1] for a first recompile,
    # as logs, recompile messages and tlparse name it, not [0/3]).
    compile_id = get_compile_id(frame_state)
    for entry in reversed(entries):
        try:
            # The same contexts Dynamo's own compile runs in: guard building and aot_autograd's
            # post-compile log events to them.
            with compile_context(CompileContext(compile_id)), get_metrics_context(), \
                    chromium_event_timed("dynamo", reset_event_log_on_exit=True,
                                         log_pt2_compile_event=True):
                guarded = _try_entry(code, entry, frame, compile_id)
        except Unportable as exc:
            _levels.count_event("entries_rejected")
            log.info("torchtpu: Dynamo cache entry for %s not used: %s", code.co_qualname, exc)
            continue
        except Exception as exc:  # a stale or damaged entry: trace instead
            _levels.count_event("entries_rejected")
            log.warning("torchtpu: Dynamo cache entry for %s not used (%s: %s)",
                        code.co_qualname, type(exc).__name__, exc)
            continue
        if guarded is not None:
            _seed_sizes(frame, entry)
            _levels.count_event("frames_loaded")
            _levels.count(lookup)
            return wrap_guarded_code(guarded)
    _levels.count(lookup, used=False)  # nothing that fits
    _give_back(compile_id)
    return None


def _give_back(compile_id) -> None:
    """Return an unused compile id to its frame's counter, so that the next one is the same."""
    from torch._dynamo.convert_frame import FRAME_COMPILE_COUNTER
    if FRAME_COMPILE_COUNTER[compile_id.frame_id] == compile_id.frame_compile_id + 1:
        FRAME_COMPILE_COUNTER[compile_id.frame_id] -= 1


# --- the hook into Dynamo -----------------------------------------------------------------

def _served(compiler_fn) -> bool:
    """Whether ``compiler_fn`` (Dynamo's, maybe wrapped) is a backend this cache serves."""
    seen = 0
    while compiler_fn is not None and seen < 8:
        if getattr(compiler_fn, "kwargs", None):
            # torch.compile's mode or options, which the backend must see: options are an
            # error and mode a warning there. Served from here, a warm process ran the frame
            # with options={"matmul_precision": ...} silently ignored.
            return False
        if any(compiler_fn is ours for ours in _backends):
            return True
        compiler_fn = (getattr(compiler_fn, "_torchdynamo_orig_backend", None)
                       or getattr(compiler_fn, "compiler_fn", None))
        seen += 1
    return False


class _TraceCapture:
    """Builds the entry for a frame Dynamo just traced, from the guard-export hook it calls
    last: then, and only then, its guards and traced code are still there (Dynamo clears them
    once the frame's compile is over)."""

    def __init__(self, chained):
        self.chained = chained
        self.entry: _Entry | None = None

    def __call__(self, guards) -> None:
        caller = sys._getframe(1).f_locals
        output, out_code = caller.get("output"), caller.get("out_code")
        try:
            if output is None or out_code is None or output.guards is not guards:
                raise Unportable("Dynamo's compile no longer looks as this cache expects")
            self.entry = _entry_from_trace(output, out_code)
        except Unportable as exc:
            _levels.count_event("bypasses")
            log.info("torchtpu: frame not cached by the Dynamo cache: %s", exc)
        except Exception as exc:  # never let the cache break a compile that worked
            _levels.count_event("bypasses")
            log.warning("torchtpu: frame not cached by the Dynamo cache (%s: %s)",
                        type(exc).__name__, exc)
        if self.chained is not None:
            self.chained(guards)


def _patched_call(original):
    def __call__(self, frame, cache_entry, hooks, frame_state, *, skip: int = 0):
        if not enabled() or not _served(self._torchdynamo_orig_backend):
            return original(self, frame, cache_entry, hooks, frame_state, skip=skip + 1)
        loaded = _load(frame, frame_state)
        if loaded is not None:
            return loaded
        capture = _TraceCapture(hooks.guard_export_fn)
        start = time.perf_counter()
        result = original(self, frame, cache_entry,
                          dataclasses.replace(hooks, guard_export_fn=capture),
                          frame_state, skip=skip + 1)
        if capture.entry is not None and hooks.guard_filter_fn is None:
            capture.entry.sizes_seen = {name: copy.copy(seen)
                                        for name, seen in _sizes_record(frame).items()}
            _save(frame.f_code, capture.entry, time.perf_counter() - start)
        return result

    __call__._torchtpu_dynamo_cache = True
    return __call__


def install(backend) -> None:
    """Serve the frames Dynamo compiles with ``backend`` (a compiler function), hooking the
    cache into Dynamo's frame conversion once per process. Frames of other backends, and every
    frame while ``config.dynamo_cache`` is off, go to Dynamo as they would (asked per frame);
    a no-op on a torch it does not support (``supported_torch``).

    Example::

        dynamo_cache.install(torchtpu_backend)   # backend.py does this when the cache is on
    """
    global _installed
    unsupported = supported_torch()
    if unsupported is not None:
        log.info("torchtpu: the Dynamo-level cache is off: %s", unsupported)
        return
    from torch._dynamo.convert_frame import ConvertFrameAssert
    with _install_lock:
        if not any(backend is ours for ours in _backends):
            _backends.append(backend)
        if _installed or getattr(ConvertFrameAssert.__call__, "_torchtpu_dynamo_cache", False):
            _installed = True
            return
        ConvertFrameAssert.__call__ = _patched_call(ConvertFrameAssert.__call__)
        _installed = True


def clear_memory() -> None:
    """Forget this process's Dynamo-level entries (level 1 only)."""
    _levels.clear_memory()
