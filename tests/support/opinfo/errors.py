"""PyTorch's error inputs on torchtpu's two paths: where eager CPU raises, we raise.

OpInfo's ``op.error_inputs(device)`` (``ErrorInput``: a sample, the exception eager raises, a
regex for its message) and ModuleInfo's ``module_error_inputs_func`` (``ErrorModuleInput``)
list inputs that eager PyTorch rejects. Each one runs first in eager CPU PyTorch, which must
raise (where it does not, the input is no error here: ``cpu-specific``, counted); its exception
type is the reference. Then, on each path (``paths.PATHS``), one verdict per input:

- ``pass``: the path raised the reference type (or a subclass), possibly wrapped by Dynamo
  (``TorchRuntimeError``, ``BackendCompilerFailed``: judged by the exception they wrap, or by
  the "got ValueError(...)" a ``TorchRuntimeError`` quotes when it keeps no cause);
- ``returns-value``: the path accepted what eager rejects (silent acceptance, the worst);
- ``other-error``: another exception type, or a crash of ours (``TorchTPUError``: a lowering
  or compile failure, not a rejection of the input);
- ``dynamo``: compile path only, where ``torch.compile(backend="eager")`` does the same (returns
  a value, or raises the same other type): Dynamo's behaviour, not ours;
- ``cpu-specific`` (eager CPU accepts it), ``construction`` (a module whose constructor raises:
  no path is involved), ``unbuildable`` (samples at a dtype their function cannot make,
  ``unsupported.py``): counted, not run.

A pass whose message misses OpInfo's regex is counted apart too ("(pass, other message)"): the
type is the contract, the words may name our own op. An entry's ``ErrorResult`` counts its
inputs by verdict; its status is its worst verdict
(``returns-value`` > ``other-error`` > ``dynamo`` > ``pass``), or ``skip`` when no input ran.
"""
from __future__ import annotations

import collections
import dataclasses
import re
import time

import torch

from . import paths, skips
from .harness import Result, _one_line, _sample_call, entry_name, skipped

#: Per-input verdicts, worst first (an entry's status is its worst one that ran).
VERDICTS = ("returns-value", "other-error", "dynamo", "pass", "cpu-specific", "construction",
            "unbuildable")
_RAN = VERDICTS[:4]


@dataclasses.dataclass
class ErrorResult(Result):
    """A ``harness.Result`` for an entry's error inputs on one path, with per-verdict counts."""
    verdicts: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Raised:
    """What one call did: ``error`` (None when it returned a value)."""
    error: BaseException | None

    def __str__(self):
        if self.error is None:
            return "returned a value"
        # Dynamo's messages name objects by address: drop it, so that runs compare.
        return "raised " + re.sub(r" at 0x[0-9a-f]+", "", _one_line(self.error, 200))


def unwrap(error: BaseException) -> BaseException:
    """The exception Dynamo's wrappers carry (``BackendCompilerFailed.inner_exception``, a
    ``TorchRuntimeError``'s cause), or ``error`` itself.

    Example::

        unwrap(TorchRuntimeError("...") from IndexError("dim"))   # the IndexError
    """
    from torch._dynamo.exc import TorchDynamoException
    seen = 0
    while isinstance(error, TorchDynamoException) and seen < 8:
        inner = getattr(error, "inner_exception", None) or error.__cause__
        if inner is None:
            break
        error, seen = inner, seen + 1
    return error


def _crash(error: BaseException) -> bool:
    """Our own failure (lowering, compile, platform), not a rejection of the input."""
    from torchtpu_compile.errors import InvalidInputError, TorchTPUError
    return isinstance(error, TorchTPUError) and not isinstance(error, InvalidInputError)


def matches(raised: Raised, expected: type) -> bool:
    """Whether ``raised`` is ``expected`` (a subclass counts), once unwrapped from Dynamo's
    wrappers; our own crashes never match.

    Example::

        matches(Raised(IndexError("x")), IndexError)   # True
    """
    from torch._dynamo.exc import TorchDynamoException
    if raised.error is None:
        return False
    inner = unwrap(raised.error)
    if isinstance(inner, TorchDynamoException) and f"got {expected.__name__}(" in str(inner):
        # Dynamo ran the op on fake tensors, which raised eager's error; it kept only the
        # message ("...: got ValueError('cat expects at least one tensor...')"), no cause.
        return True
    return isinstance(inner, expected) and not _crash(inner)


def _same_kind(a: Raised, b: Raised) -> bool:
    """Both returned, or both raised the same type once unwrapped."""
    if a.error is None or b.error is None:
        return a.error is None and b.error is None
    return type(unwrap(a.error)) is type(unwrap(b.error))


def _call(run, fn, args, kwargs) -> Raised:
    try:
        run(fn, args, kwargs)
    except Exception as exc:  # the outcome under test
        return Raised(exc)
    return Raised(None)


def _run_dynamo_eager(fn, args, kwargs):
    """``torch.compile(fn, backend="eager")``: Dynamo alone, the compile path's bar."""
    return paths.run_compiled(fn, args, kwargs, backend="eager")


def judge(path: str, call, expected: type, note_message=None) -> tuple:
    """(verdict, what the path did) for one input that eager CPU rejects with ``expected``;
    ``call(run)`` runs the input through a path's runner ``run``.

    Example::

        judge("eager", lambda run: run(torch.ones(2).view, ((3,),), {}), RuntimeError)
    """
    ours = call(paths.PATHS[path])
    if matches(ours, expected):
        return "pass", ours
    if path == "compile":
        bar = call(_run_dynamo_eager)
        if not matches(bar, expected) and _same_kind(ours, bar):
            return "dynamo", ours
    return ("returns-value" if ours.error is None else "other-error"), ours


def _message_differs(raised: Raised, regex) -> bool:
    """Whether the path's message misses OpInfo's regex for eager's (noted, not a verdict)."""
    return bool(raised.error is not None and regex and
                not re.search(regex, str(unwrap(raised.error))))


def _run_cpu(fn, args, kwargs):
    """Eager CPU PyTorch: the reference every path is judged against."""
    return fn(*args, **kwargs)


def _check_input(result: ErrorResult, notes: list, what: str, call, regex) -> None:
    """One error input: ``call(run)`` runs it through a runner (``_run_cpu``, a path's)."""
    reference = call(_run_cpu)
    if reference.error is None:
        _record(result, notes, what, "cpu-specific")
        return
    expected = type(reference.error)
    try:
        verdict, ours = judge(result.path, call, expected)
    except Exception as exc:  # the harness itself failed on this input: say so, go on
        verdict, ours = "other-error", Raised(exc)
    if verdict == "pass" and _message_differs(ours, regex):
        result.verdicts["(pass, other message)"] = \
            result.verdicts.get("(pass, other message)", 0) + 1
    _record(result, notes, what, verdict,
            "" if verdict == "pass" else f"eager raises {expected.__name__}, {ours}")


def _record(result: ErrorResult, notes: list, what: str, verdict: str, detail: str = "") -> None:
    result.verdicts[verdict] = result.verdicts.get(verdict, 0) + 1
    if verdict in _RAN:
        result.samples += 1
    if verdict in _RAN[:3]:  # the inputs to look at; the others are counted
        notes.append(f"[{what}] {verdict}" + (f": {detail}" if detail else ""))


def _conclude(result: ErrorResult, start: float, notes: list) -> ErrorResult:
    result.seconds = time.perf_counter() - start
    ran = [v for v in _RAN if result.verdicts.get(v)]
    if ran:
        result.status = ran[0]
    else:
        result.status, result.category = "skip", "test-artifact"
        notes.insert(0, f"no error input reaches a path (eager CPU accepts it, the module's "
                        f"constructor raises, or no sample builds): {result.verdicts}")
    result.detail = "; ".join(notes)
    return result


def _describe(sample) -> str:
    """A short account of a sample's arguments: shapes and dtypes of tensors, values else."""
    def show(value):
        if isinstance(value, torch.Tensor):
            shape = list(value.shape) if value.dim() <= 6 else f"{value.dim()} dims"
            return f"T{shape}:{str(value.dtype).removeprefix('torch.')}"
        if isinstance(value, (list, tuple)):
            inner = ", ".join(show(v) for v in value[:4])
            return f"[{inner}{', ...' if len(value) > 4 else ''}]"
        return repr(value)[:40]
    parts = [show(sample.input)] + [show(a) for a in sample.args] + \
        [f"{k}={show(v)}" for k, v in sample.kwargs.items()]
    return ", ".join(parts)


def check_errors(op, path: str) -> ErrorResult:
    """Run every error input of OpInfo ``op`` on ``path`` (see module doc).

    Example::

        from torch.testing._internal.common_methods_invocations import op_db
        cat = next(o for o in op_db if o.name == "cat")
        check_errors(cat, "eager").verdicts   # {"pass": 10, "cpu-specific": 4}
    """
    result = ErrorResult(entry_name(op), path, "fp32", "pass")
    if skipped(result, table=skips.ERROR_SKIPS):
        return result
    start = time.perf_counter()
    notes: list = []
    for index, error_input in enumerate(op.error_inputs("cpu")):
        sample = error_input.sample_input

        def call(run, sample=sample):
            args, kwargs = _sample_call(sample)
            return _call(run, op.op, args, kwargs)
        _check_input(result, notes, f"{index}: {_describe(sample)}", call,
                     error_input.error_regex)
    return _conclude(result, start, notes)


def check_module_errors(info, path: str) -> ErrorResult:
    """Run every error input of ModuleInfo ``info`` (fp32, training mode) on ``path``: the
    module built on the CPU, then called on the path as ``modules.check_module`` calls it (on
    the eager path, moved to the ``tpu`` device first). Inputs that make the constructor raise
    are counted (``construction``): no path is involved.

    Example::

        check_module_errors(module_entries()["nn.Embedding"], "compile").status   # "pass"
    """
    from torch.testing._internal.common_modules import ModuleErrorEnum
    from .modules import _forward_call
    result = ErrorResult(info.name, path, "fp32", "pass")
    if skipped(result, table=skips.MODULE_ERROR_SKIPS):
        return result
    start = time.perf_counter()
    notes: list = []
    inputs = info.module_error_inputs_func(info, device="cpu", dtype=torch.float32,
                                           requires_grad=False, training=True)
    for index, error_input in enumerate(inputs):
        module_input = error_input.module_error_input
        what = f"{index}: {error_input.error_regex[:60]}"
        if error_input.error_on == ModuleErrorEnum.CONSTRUCTION_ERROR:
            _record(result, notes, what, "construction")
            continue

        def call(run, module_input=module_input):
            constructor = module_input.constructor_input
            torch.manual_seed(0)
            module = info.module_cls(*constructor.args, **constructor.kwargs)
            if path in paths.ON_DEVICE and run is paths.PATHS[path]:  # not the reference's
                module.to("tpu")
            args, kwargs = _forward_call(module_input)
            return _call(run, module, args, kwargs)
        _check_input(result, notes, what, call, error_input.error_regex)
    return _conclude(result, start, notes)


def has_error_inputs(entry, db: str) -> bool:
    """Whether an OpInfo or ModuleInfo entry lists error inputs."""
    attribute = "module_error_inputs_func" if db == "modules" else "error_inputs_func"
    return getattr(entry, attribute, None) is not None


def totals(results: list) -> dict:
    """{path: {verdict: inputs}} over result dicts (``ErrorResult.to_json()``).

    Example::

        totals([check_errors(cat, "eager").to_json()])   # {"eager": {"pass": 6, ...}}
    """
    out: dict = {}
    for r in results:
        counts = out.setdefault(r["path"], collections.Counter())
        counts.update(r.get("verdicts") or {})
        if r["status"] == "fail":  # a worker that crashed or hung on the entry
            counts["crashed entries"] += 1
    return {path: dict(counts) for path, counts in out.items()}
