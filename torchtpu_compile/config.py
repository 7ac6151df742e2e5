"""Every setting of torchtpu, declared once: its environment variable, default, accepted values
and meaning.

A setting is read as a module attribute and set by assignment or, for a block of code or a
test, with ``patch``. Its value is, first to last: the value set in code, else its environment
variable, else its default. The variable is read when the setting is read (each consumer reads
a setting at a stated moment: see its doc), so a variable set in ``os.environ`` before that
moment counts. A value the setting does not accept is an error naming the setting (or the
variable), the value and what it accepts, raised when it is set or read: never a silent
default.

Example::

    from torchtpu_compile import config
    config.matmul_precision = "highest"        # fp32 matmuls, even on TPU
    with config.patch(strict=True, max_buckets=4):
        ...                                    # restored on exit, also on an exception
    config.max_buckets = "abc"                 # ConfigError: ... expected an integer >= 1

``docs/configuration.md`` is ``reference()``'s output (``make config-docs`` writes it).

Like ``torch.utils._config_module`` (declarations, attribute access, ``patch``, a hash of the
settings that shape compiled code) but written here: that module validates nothing, parses
only "0"/"1" from the environment and reads it once at import, keeps overrides per thread (a
setting made on the main thread would not reach a worker thread), and lives in torch's private
API; this module is the base layer and imports nothing heavy.
"""
from __future__ import annotations

import contextlib
import hashlib
import operator
import os
import sys
import types
import warnings
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

from .errors import ConfigError

__all__ = ["ConfigError", "Setting", "settings", "patch", "reset", "compile_hash", "describe",
           "reference"]

_UNSET = object()


# --- value kinds: how a setting parses its variable and checks a value set in code ----------

class _Kind:
    """How one kind of setting reads its variable (``parse``) and checks a value set in code
    (``check``); both raise ValueError with no more than what was wrong (the setting adds
    the names). ``accepted`` describes the values, for errors and the reference."""

    accepted = ""
    in_code = None  # what code may set, where it differs from ``accepted``

    def parse(self, raw: str):
        raise NotImplementedError

    def check(self, value):
        raise NotImplementedError


class _Flag(_Kind):
    accepted = "1, true, yes, on or 0, false, no, off"
    in_code = "True or False"
    _TRUE = ("1", "true", "yes", "on")
    _FALSE = ("0", "false", "no", "off")

    def parse(self, raw):
        word = raw.strip().lower()
        if word in self._TRUE:
            return True
        if word in self._FALSE:
            return False
        raise ValueError

    def check(self, value):
        if isinstance(value, bool):
            return value
        raise ValueError


class _Choice(_Kind):
    def __init__(self, *options: str, unset: str | None = None):
        self.options = options
        self.optional = unset is not None
        self.accepted = "one of " + ", ".join(options) + (f" (unset: {unset})" if unset else "")

    def parse(self, raw):
        return self.check(raw)

    def check(self, value):
        if value is None and self.optional:
            return None
        if isinstance(value, str) and value.strip().lower() in self.options:
            return value.strip().lower()
        raise ValueError


class _Int(_Kind):
    def __init__(self, minimum: int):
        self.minimum = minimum
        self.accepted = f"an integer >= {minimum}"

    def parse(self, raw):
        return self.check(int(raw.strip()))

    def check(self, value):
        if isinstance(value, bool):
            raise ValueError
        value = operator.index(value)  # TypeError for a float or a string
        if value < self.minimum:
            raise ValueError
        return value


class _Text(_Kind):
    def __init__(self, what: str):
        self.accepted = what

    def parse(self, raw):
        return raw

    def check(self, value):
        if value is None or (isinstance(value, str) and value):
            return value
        raise ValueError


class _Folder(_Kind):
    _OFF = ("0", "off", "none", "false")
    accepted = "a folder, or off (also 0, none, false) to turn it off"

    def parse(self, raw):
        return None if raw.strip().lower() in self._OFF else raw

    def check(self, value):
        if value is None:
            return None
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if isinstance(value, str) and value:
            return value
        raise ValueError


class _BucketPolicy(_Kind):
    accepted = ("pow2-128, pow2, multiple-N (N >= 1), a ladder of two or more sizes such as "
                "16,64,256, or (in code) a list of sizes or a callable size -> bucket")

    @staticmethod
    def _ladder(rungs) -> bool:
        try:
            return len(rungs) >= 2 and all(int(r) >= 1 for r in rungs)
        except (TypeError, ValueError):
            return False

    def parse(self, raw):
        return self.check(raw.strip())

    def check(self, value):
        if callable(value):
            return value
        if isinstance(value, (list, tuple)) and self._ladder(value):
            return value
        if isinstance(value, str):
            if value in ("pow2-128", "pow2") or "," in value and self._ladder(value.split(",")):
                return value
            step = value[len("multiple-"):] if value.startswith("multiple-") else ""
            if step.isdigit() and int(step) >= 1:
                return value
        raise ValueError


# --- the declarations -----------------------------------------------------------------------

@dataclass(eq=False)
class Setting:
    """One setting: ``env`` gives its value when code has not set one; ``default`` (or
    ``default_factory()``, called at each read) when neither has. ``compiled``: it changes the
    program a graph compiles to, so it enters ``compile_hash``. ``secret``: never shown.
    ``old_env``: deprecated variable names, still read (with a FutureWarning) when ``env`` is
    unset."""

    name: str
    env: str
    default: Any
    kind: _Kind
    doc: str
    group: str
    default_text: str | None = None  # markdown, where the value alone would not say it
    compiled: bool = False
    secret: bool = False
    old_env: tuple = ()
    default_factory: Callable[[], Any] | None = None

    def __post_init__(self):
        self._seen = (_UNSET, None)  # (raw variable, its parsed value): parse once per value
        self._key = os.environ.encodekey(self.env)  # the variable's key in os.environ._data

    def _show(self, value) -> str:
        return "<secret>" if self.secret else repr(value)

    def check(self, value):
        """``value`` as this setting holds it; ConfigError where it does not accept it."""
        try:
            return self.kind.check(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"torchtpu_compile.config.{self.name} = {self._show(value)} is not accepted: "
                f"expected {self.kind.in_code or self.kind.accepted} (environment variable "
                f"{self.env})") from None

    def _parse(self, variable: str, raw: str):
        try:
            return self.kind.parse(raw)
        except (TypeError, ValueError):
            raise ConfigError(
                f"{variable}={self._show(raw)} is not accepted by torchtpu_compile.config."
                f"{self.name}: expected {self.kind.accepted}") from None

    def from_environment(self):
        """The value from the environment now (its variable, else its default)."""
        raw = _environ(self.env, self._key)
        seen_raw, seen_value = self._seen
        if raw is not None and raw == seen_raw:
            return seen_value
        variable = self.env
        if not raw and self.old_env:
            variable, raw = _old_variable(self)
        if not raw:  # unset or empty: the default
            return self.default_factory() if self.default_factory else self.default
        text = raw.decode(_FS_ENCODING, "surrogateescape") if isinstance(raw, bytes) else raw
        value = self._parse(variable, text)
        if variable == self.env:
            self._seen = (raw, value)
        return value


_FS_ENCODING = sys.getfilesystemencoding()


#: ``os.environ`` and the dict behind it, which its writes keep current. Settings are read per
#: compiled call; ``os.environ.get`` of an unset variable costs ~1.5 us (a KeyError raised and
#: caught inside it), a look in this dict ~0.05 us.
_ENVIRON = os.environ
_ENVIRON_DATA = getattr(os.environ, "_data", None)


def _environ(name: str, key):
    """The variable's raw value (bytes on POSIX) or None."""
    environ = os.environ
    if environ is _ENVIRON and _ENVIRON_DATA is not None:
        return _ENVIRON_DATA.get(key)
    return environ.get(name)  # os.environ replaced by another mapping


def _old_variable(setting: Setting) -> tuple[str, str | None]:
    for old in setting.old_env:
        raw = os.environ.get(old)
        if raw:
            if old not in _warned:
                _warned.add(old)
                warnings.warn(f"{old} is deprecated and will stop working in the next release; "
                              f"set {setting.env} instead", FutureWarning, stacklevel=4)
            return old, raw
    return setting.env, None


_warned: set = set()


def _default_cache_dir() -> str:
    # Read per cache lookup: expanduser costs ~7 us, so keep the answer for the HOME it used.
    home = _environ("HOME", _HOME_KEY)
    if _default_cache_dir.seen[0] != home:
        _default_cache_dir.seen = (home, os.path.join(os.path.expanduser("~"), ".cache",
                                                      "torchtpu"))
    return _default_cache_dir.seen[1]


_default_cache_dir.seen = (_UNSET, None)
_HOME_KEY = os.environ.encodekey("HOME")


_SETTINGS = (
    # -- compile path --
    Setting("platform", "TORCHTPU_PLATFORM", None,
            _Choice("tpu", "cuda", "cpu", unset="the best platform present"),
            "The PJRT platform, chosen once per process when the PJRT client is first needed.",
            "compile", default_text="best present: `tpu`, then `cuda`, then `cpu`"),
    Setting("cpu_dispatch", "TORCHTPU_CPU_DISPATCH", "sync", _Choice("sync", "async"),
            "How the PJRT CPU client runs a program: sync (on the calling thread, as the "
            "call's own work) or async (queued to PJRT's thread pool, the caller going on "
            "until it reads a result). sync measured faster on this project's CPU benchmarks: "
            "a small program costs 7 us inline against 35 us through the pool. Other "
            "platforms are asynchronous by nature. Read once, when the client starts, and "
            "only if jax has not started its CPU backend already (then jax's own setting, "
            "jax_cpu_enable_async_dispatch, stands).",
            "compile"),
    Setting("matmul_precision", "TORCHTPU_MATMUL_PRECISION", None,
            _Choice("medium", "high", "highest",
                    unset="follow torch.set_float32_matmul_precision"),
            "Precision of f32 matmuls and convolutions (medium: bf16 passes with f32 "
            "accumulation, TPU's default; high; highest: f32). None follows "
            "torch.set_float32_matmul_precision if it was called, else medium. Read when a "
            "graph is compiled or an eager op runs.",
            "compile", compiled=True),
    Setting("strict", "TORCHTPU_STRICT", False, _Flag(),
            "An op that cannot be lowered, or a Dynamo graph break, is an error naming the op, "
            "its shapes and the source line, instead of running in eager PyTorch.",
            "compile"),
    Setting("check_indices", "TORCHTPU_CHECK_INDICES", True, _Flag(),
            "Programs check tensor indices (x[i], gather, scatter, embedding, ...) against "
            "their dim and raise eager's error; off: XLA clamps them. Read when a program is "
            "built.",
            "compile", compiled=True),
    Setting("random_draws", "TORCHTPU_RANDOM_DRAWS", "auto", _Choice("auto", "device", "host"),
            "Where compiled graphs draw dropout masks, rand_like, randn_like and bernoulli: "
            "device (inside the program, JAX's threefry keyed from torch's generator at each "
            "call: torch.manual_seed reproduces them, same distribution, not eager's bits, as "
            "Inductor), host (from torch's generator, then uploaded: a host draw and a "
            "transfer of every mask per call), or auto (device, except on the CPU client, "
            "where the host draw measured faster). Read when a graph is built.",
            "compile", compiled=True),
    Setting("excess_precision", "TORCHTPU_EXCESS_PRECISION", "auto",
            _Choice("auto", "on", "off"),
            "Whether XLA may keep bfloat16/float16 intermediates in float32 "
            "(xla_allow_excess_precision). off: every half-width op's result is rounded, as "
            "eager PyTorch rounds it (a bf16 matmul followed by .float() gives eager's value), "
            "at the cost of a convert per op; on: XLA's default, faster, more precise than "
            "eager. auto: off on the CPU and CUDA clients, on on TPU. An "
            "--xla_allow_excess_precision in XLA_FLAGS wins over auto. Read when a program "
            "is compiled.",
            "compile", compiled=True),
    Setting("exact_index_arithmetic", "TORCHTPU_EXACT_INDEX_ARITHMETIC", True, _Flag(),
            "Float arithmetic that a graph converts to integers (positions, indices: "
            "(x * r - r + 0.5).long()) rounds after each op as eager does; XLA would "
            "otherwise fold its constants together and fuse a product and a sum into one FMA, "
            "and one ulp is another index. Costs an add per such op; off: XLA's rounding. Read "
            "when a program is built.",
            "compile", compiled=True),
    Setting("donate_buffers", "TORCHTPU_DONATE_BUFFERS", True, _Flag(),
            "A compiled graph that overwrites an input of the eager tpu device (an optimizer "
            "step's parameters and state, batch norm's running statistics, a static KV cache) "
            "writes the new value into that input's buffer, where nothing else holds it, "
            "instead of holding both. Read when a graph is built.",
            "compile"),
    Setting("split_backward", "TORCHTPU_SPLIT_BACKWARD", "auto", _Choice("auto", "on", "off"),
            "A backward graph whose saved inputs die early (a language model's logits, read "
            "once to make their gradient) runs as a few programs, cut where the largest of "
            "them die, so that they are freed before the rest of the backward makes its "
            "gradients: a lower peak of device memory for a launch or two more per step. "
            "auto: on, except on the CPU client, where the host's peak is set by the freed "
            "heap glibc keeps and the cuts measured 2-4% slower on a GPT-2 step. Read when a "
            "graph is built.",
            "compile"),
    # -- caches --
    Setting("cache_dir", "TORCHTPU_CACHE_DIR", None, _Folder(),
            "Level 2 of the compile cache, on host disk; None turns it off.",
            "cache", default_text="`~/.cache/torchtpu`", default_factory=_default_cache_dir),
    Setting("cache_max_bytes", "TORCHTPU_CACHE_MAX_BYTES", 4 << 30, _Int(0),
            "Size cap of the disk cache; least-recently-used entries go first.",
            "cache", default_text="`4294967296` (4 GiB)"),
    Setting("remote_cache", "TORCHTPU_REMOTE_CACHE", None,
            _Text("a URL: file:///dir, or an fsspec URL such as gs://bucket/dir"),
            "Level 3 of the compile cache, shared; an fsspec URL (gs://, s3://) needs "
            "cache_key. None turns it off.",
            "cache", default_text="`None` (off)"),
    Setting("cache_key", "TORCHTPU_CACHE_KEY", None, _Text("any non-empty text"),
            "A secret shared by the people who share a compile cache: every entry is signed "
            "with it (HMAC-SHA256) and entries not signed with it are refused. Without it only "
            "a folder no other user can write is used.",
            "cache", secret=True),
    Setting("process_cache_entries", "TORCHTPU_PROCESS_CACHE_ENTRIES", 2048, _Int(16),
            "Entries each in-process table of eager ops' programs, traces and lowerings keeps, "
            "the least recently used dropped first: a compiled program holds native code "
            "mappings, of which a process has a limited number. A dropped one is loaded from "
            "the disk cache, or compiled, when met again. Read at each insertion.",
            "cache"),
    Setting("process_cache_programs", "TORCHTPU_PROCESS_CACHE_PROGRAMS", 64, _Int(1),
            "Whole compiled programs (graphs' executables, fused recordings) this process keeps "
            "beyond those its live graphs hold, the least recently used dropped first: each "
            "holds about 3 code mappings per kernel. Read at each insertion.",
            "cache"),
    Setting("graph_cache", "TORCHTPU_GRAPH_CACHE", True, _Flag(),
            "Also cache aot_autograd results and lowered StableHLO, at the same levels as the "
            "executables; torch's force_disable_caches turns it off too.",
            "cache"),
    Setting("dynamo_cache", "TORCHTPU_DYNAMO_CACHE", True, _Flag(),
            "Also cache Dynamo's output per frame (bytecode, guards checked by portable "
            "fingerprints), so that a warm process skips tracing. Off by itself on a torch "
            "release it was not tested on. Its hook is installed when the backend is imported, "
            "if this is on then.",
            "cache"),
    # -- dynamic shapes --
    Setting("buckets", "TORCHTPU_BUCKETS", True, _Flag(),
            "Serve dims Dynamo reports dynamic with a few padded buckets, each compiled once; "
            "off: one compile per concrete size.",
            "buckets"),
    Setting("bucket_policy", "TORCHTPU_BUCKET_POLICY", "pow2-128", _BucketPolicy(),
            "How a real size maps to its bucket: pow2-128 (powers of two up to 128, multiples "
            "of 128 above), pow2, multiple-N, a ladder (sizes past its end take multiples of "
            "its last step), or a callable.",
            "buckets"),
    Setting("bucket_min", "TORCHTPU_BUCKET_MIN", 8, _Int(1),
            "The smallest bucket of the power-of-two policies.",
            "buckets"),
    Setting("max_buckets", "TORCHTPU_MAX_BUCKETS", 8, _Int(1),
            "Programs one graph may compile for its buckets; past it sizes reuse a covering "
            "bucket, and only a size beyond every bucket compiles a new one (logged).",
            "buckets"),
    Setting("background_buckets", "TORCHTPU_BACKGROUND_BUCKETS", False, _Flag(),
            "Once a graph compiles a bucket, compile its next larger one on a background "
            "thread, so that a longer input later finds it ready (one build at a time; off: "
            "each bucket compiles when first needed).",
            "buckets"),
    # -- the eager tpu device --
    Setting("launch_blocking", "TORCH_TPU_LAUNCH_BLOCKING", False, _Flag(),
            "Start the eager tpu device in debug mode: each op waits for its result, and an "
            "error is raised at the op that caused it. Read when the device runs its first op; "
            "torch.tpu.set_eager_mode switches later.",
            "eager"),
    Setting("defer_and_fuse", "TORCH_TPU_DEFER_AND_FUSE", False, _Flag(),
            "Start the eager tpu device in defer-and-fuse mode: ops are recorded and compiled "
            "as one program at a materialization point. Cannot be combined with "
            "launch_blocking. Read when the device runs its first op.",
            "eager"),
    Setting("backward_on_calling_thread", "TORCHTPU_BACKWARD_ON_CALLING_THREAD", True, _Flag(),
            "Run the backward of tpu tensors on the thread that calls backward(), as for CPU "
            "tensors, instead of on autograd's device thread (a handoff between two threads "
            "at every backward). Applied per thread at its first tpu op, through "
            "torch.autograd.set_multithreading_enabled(False), which then holds for every "
            "device's backward started from that thread.",
            "eager"),
    Setting("fuse_max_ops", "TORCHTPU_FUSE_MAX_OPS", 5000, _Int(1),
            "A defer-and-fuse recording runs once it holds this many ops. Read when the "
            "defer-and-fuse mode is entered.",
            "eager", old_env=("TORCH_TPU_FUSE_MAX_OPS",)),
    Setting("fuse_max_inputs", "TORCHTPU_FUSE_MAX_INPUTS", 2000, _Int(1),
            "A defer-and-fuse recording runs once it reads this many input buffers. Read when "
            "the defer-and-fuse mode is entered.",
            "eager", old_env=("TORCH_TPU_FUSE_MAX_INPUTS",)),
    Setting("fuse_repeats", "TORCHTPU_FUSE_REPEATS", True, _Flag(),
            "Cut a defer-and-fuse recording at a repeated block of ops (a loop body), so every "
            "iteration reuses one compiled program. Read when the defer-and-fuse mode is "
            "entered.",
            "eager", old_env=("TORCH_TPU_FUSE_REPEATS",)),
    Setting("fuse_compile_at", "TORCHTPU_FUSE_COMPILE_AT", 5, _Int(1),
            "A defer-and-fuse recording is compiled as one program the time its key (ops, "
            "wiring, shapes) is seen this often; the times before, its ops run one by one "
            "through their per-op programs, strict mode's, so a loop whose recordings differ "
            "each time (sentences of other lengths) compiles no program it runs once or twice. "
            "1: compile every recording at once. Read when the defer-and-fuse mode is "
            "entered.",
            "eager"),
    # -- tpu_dist --
    Setting("dist_coordinator_host", "TORCHTPU_DIST_COORDINATOR_HOST", None,
            _Text("a host name or address"),
            "Where the other ranks reach rank 0's coordinator; None: MASTER_ADDR, else the "
            "host of the rendezvous store, else this host's name. Read when the first tpu_dist "
            "group is made.",
            "distributed"),
    Setting("dist_transport", "TORCHTPU_DIST_TRANSPORT", "auto", _Choice("auto", "staged"),
            "How a tpu_dist group runs collectives: auto (PJRT collectives where every rank "
            "is in one joined client, else staged through the host) or staged (always through "
            "the host, to compare the transports). Read when a group is made.",
            "distributed"),
    Setting("dist_check", "TORCHTPU_DIST_CHECK", True, _Flag(),
            "Compare the ranks' shapes and dtypes before each tpu_dist collective, so a "
            "mismatch is an error on every rank; off skips it (a mismatch is then not caught). "
            "Read before each collective.",
            "distributed"),
)

_BY_NAME = {s.name: s for s in _SETTINGS}

#: Values set in code (assignment or ``patch``), by setting name: they win over the
#: environment. Shared by all threads, as module attributes were.
_overrides: dict = {}


def settings() -> tuple[Setting, ...]:
    """Every declared setting, in reference order.

    Example::

        [s.env for s in config.settings()]   # ['TORCHTPU_PLATFORM', ...]
    """
    return _SETTINGS


def _setting(name: str) -> Setting:
    try:
        return _BY_NAME[name]
    except KeyError:
        import difflib
        close = difflib.get_close_matches(name, _BY_NAME, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise AttributeError(f"torchtpu_compile.config has no setting {name!r}{hint} "
                             f"(settings: {', '.join(_BY_NAME)})") from None


def _set(name: str, value) -> None:
    setting = _setting(name)
    _overrides[name] = setting.check(value)


def reset(*names: str) -> None:
    """Forget values set in code for ``names`` (all settings when none are given): they follow
    their environment variable and default again.

    Example::

        config.strict = True
        config.reset("strict")   # TORCHTPU_STRICT, else False
    """
    for name in names or tuple(_overrides):
        _setting(name)
        _overrides.pop(name, None)


class _Patch(contextlib.ContextDecorator):
    """``patch``'s result: a context manager and decorator, reentrant."""

    def __init__(self, changes: dict):
        self._changes = changes
        self._saved: list[dict] = []

    def __enter__(self):
        self._saved.append({name: _overrides.get(name, _UNSET) for name in self._changes})
        _overrides.update(self._changes)
        return sys.modules[__name__]

    def __exit__(self, *exc_info):
        for name, value in self._saved.pop().items():
            if value is _UNSET:
                _overrides.pop(name, None)
            else:
                _overrides[name] = value
        return False


def patch(changes: dict | None = None, /, **overrides) -> _Patch:
    """Set settings for a block of code or a function, then put back what was there (a value
    set in code, or the environment and default), also when it raises. Values are checked now,
    as an assignment checks them. Like an assignment, it applies to every thread.

    Example::

        with config.patch(strict=True, matmul_precision="highest"):
            y = compiled(x)

        @config.patch(buckets=False)
        def test_one_compile_per_size(): ...
    """
    changes = {**(changes or {}), **overrides}
    return _Patch({name: _setting(name).check(value) for name, value in changes.items()})


def compile_hash() -> str:
    """A digest of the settings that change the program a graph compiles to (``compiled``:
    matmul_precision, check_indices), for cache keys; the others (where caches live, bucket
    choice, strictness, eager and tpu_dist behaviour) change which graphs are built or how they
    run, and each graph is keyed by itself.

    Example::

        with config.patch(check_indices=False):
            assert config.compile_hash() != unpatched
    """
    module = sys.modules[__name__]
    values = "|".join(f"{s.name}={getattr(module, s.name)!r}" for s in _SETTINGS if s.compiled)
    return hashlib.sha256(values.encode()).hexdigest()[:16]


# --- the reference ----------------------------------------------------------------------------

_GROUPS = {"compile": "Compile path", "cache": "Compile cache", "buckets": "Dynamic shapes",
           "eager": "Eager tpu device", "distributed": "tpu_dist"}


def _default_text(setting: Setting) -> str:
    if setting.default_text is not None:
        return setting.default_text
    if isinstance(setting.default, bool):
        return "on" if setting.default else "off"
    return f"`{setting.default}`"


def _accepted_text(kind: _Kind) -> str:
    return kind.accepted + (f"; in code: {kind.in_code}" if kind.in_code else "")


def describe() -> str:
    """The settings as markdown tables, one per area: setting, variable, default, accepted
    values, meaning.

    Example::

        print(config.describe())
    """
    lines = []
    for group, title in _GROUPS.items():
        lines += [f"### {title}", "",
                  "| setting | environment variable | default | accepted values | meaning |",
                  "|---|---|---|---|---|"]
        for s in (s for s in _SETTINGS if s.group == group):
            env = f"`{s.env}`" + "".join(f" (deprecated: `{old}`)" for old in s.old_env)
            hashed = " In `compile_hash()`." if s.compiled else ""
            lines.append(f"| `{s.name}` | {env} | {_default_text(s)} | {_accepted_text(s.kind)} | "
                         f"{s.doc}{hashed} |")
        lines.append("")
    return "\n".join(lines)


_REFERENCE_HEAD = """\
# Configuration

<!-- Generated from torchtpu_compile/config.py by `make config-docs`; edit the declarations
there, not this file (tests/test_config.py checks that they agree). -->

Every setting is an attribute of `torchtpu_compile.config` with an environment variable.
Its value is, first to last: the value set in code (`config.strict = True`, or
`config.patch(...)`), else the environment variable, else the default. The variable is read
when the setting is read (each setting says when its consumer reads it), so setting it in
`os.environ` before that moment counts. A value a setting does not accept is a
`torchtpu_compile.errors.ConfigError` (a `ValueError`) naming the setting or the variable, the
value and the accepted values, raised when the value is set or read.

```python
from torchtpu_compile import config

config.matmul_precision = "highest"            # checked: "fast" would raise
with config.patch(strict=True, max_buckets=4):  # scoped, restored on exit or exception
    ...

@config.patch(buckets=False)                   # also a decorator
def test_one_compile_per_size(): ...

config.reset("matmul_precision")               # back to the variable and the default
```

`config.patch` and assignments apply to every thread of the process. `config.compile_hash()`
digests the settings that change the program a graph compiles to (marked below); the lowering
cache puts it in its key.

The variables of the eager device's mode keep PyTorch's device spelling
(`TORCH_TPU_LAUNCH_BLOCKING`, `TORCH_TPU_DEFER_AND_FUSE`); every other one is `TORCHTPU_*`. The
former `TORCH_TPU_FUSE_*` names are still read, with a `FutureWarning`, when the new name is
unset; they stop working in the next release. A set variable that nearly spells a setting's
(`TORCHTPU_DEFER_AND_FUSE`, `TORCHTPU_MATMUL_PRECISON`) gets a `UserWarning` naming it.

The logger is configured by PyTorch's `TORCH_LOGS` (`+torchtpu` debug, `torchtpu` info,
`-torchtpu` errors only), not here.

"""


def reference() -> str:
    """The whole of ``docs/configuration.md``."""
    return _REFERENCE_HEAD + describe()


# --- module attribute access ------------------------------------------------------------------

def _property(setting: Setting) -> property:
    name, key, default = setting.name, setting._key, setting.default
    from_environment = setting.from_environment
    plain_default = not setting.old_env and setting.default_factory is None

    def get(_module):
        # The common cases inline (no override; variable unset, or as last parsed): a read is
        # a few dict lookups. Everything else: from_environment.
        value = _overrides.get(name, _UNSET)
        if value is not _UNSET:
            return value
        if os.environ is _ENVIRON and _ENVIRON_DATA is not None:
            raw = _ENVIRON_DATA.get(key)
            if raw is None:
                if plain_default:
                    return default
            elif raw == setting._seen[0]:
                return setting._seen[1]
        return from_environment()

    def set_(_module, value):
        _overrides[name] = setting.check(value)

    return property(get, set_, doc=setting.doc)


class _ConfigModule(types.ModuleType):
    """This module, with each setting a property: reads resolve code > environment > default,
    assignments are checked, and an unknown public name is an error, not a new attribute."""

    def __setattr__(self, name: str, value) -> None:
        if name in _BY_NAME or name.startswith("_") or name in self.__dict__:
            super().__setattr__(name, value)
        else:
            _setting(name)  # raises AttributeError naming the settings

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(_BY_NAME))


def _check_variable_names(environ=os.environ) -> None:
    """Warn for each set variable that is no setting's but nearly spells one's (a letter
    missing, ``TORCHTPU_DEFER_AND_FUSE`` for ``TORCH_TPU_DEFER_AND_FUSE``): such a typo was
    ignored without a word, and the run went on under the default.

    Example::

        _check_variable_names({"TORCHTPU_MATMUL_PRECISON": "highest"})
        # UserWarning: TORCHTPU_MATMUL_PRECISON is set but is no torchtpu setting; did you
        # mean TORCHTPU_MATMUL_PRECISION? ...
    """
    known = {s.env for s in _SETTINGS} | {old for s in _SETTINGS for old in s.old_env or ()}
    for name in environ:
        if name in known or not name.startswith(("TORCHTPU_", "TORCH_TPU_")):
            continue
        import difflib
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.9)
        if close:
            warnings.warn(f"{name} is set but is no torchtpu setting; did you mean {close[0]}? "
                          f"(every setting: docs/configuration.md)", UserWarning, stacklevel=2)


for _s in _SETTINGS:
    setattr(_ConfigModule, _s.name, _property(_s))
del _s
_check_variable_names()
sys.modules[__name__].__class__ = _ConfigModule
