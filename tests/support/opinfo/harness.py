"""One OpInfo entry on one path and dtype, compared with eager CPU: ``check(op, path, dtype)``.

An entry passes on a path when, for each of its first ``max_samples`` samples, the path's
result matches eager CPU PyTorch and nothing ran outside XLA (no eager fallback, no Dynamo graph
break). Statuses:

- ``pass``;
- ``fallback``: results match, but some op ran in eager PyTorch (named, with the backend's reason)
  or Dynamo broke the graph; not a pass on XLA;
- ``fail``: an exception, or results that differ (the message says which);
- ``skip``: listed in ``skips.py`` (category and reason), or the path is unavailable;
- ``n/a``: the op does not support the dtype on CPU (not counted).
"""
from __future__ import annotations

import dataclasses
import time
import traceback

import torch
from torch.utils._pytree import tree_flatten, tree_map

from . import paths, skips

#: Elementwise tolerances. fp32 runs under matmul precision "highest"; the bound leaves room
#: for XLA's own exp/log/erf approximations (a few ulp) and reduction order. bf16 uses the
#: numerics policy's rtol (torchtpu_compile.numerics.policy) and an atol at bf16's resolution
#: near 1, since sums that cancel keep bf16 rounding in absolute terms.
TOLERANCES = {torch.float32: dict(rtol=1e-4, atol=1e-5),
              torch.complex64: dict(rtol=1e-4, atol=1e-5),
              torch.bfloat16: dict(rtol=5e-2, atol=1e-2),
              # About ten of f16's units in the last place near 1 (bf16's bound above would
              # pass a result rounded at every step where eager rounds once).
              torch.float16: dict(rtol=1e-2, atol=1e-3),
              # Far below float32's resolution: a float64 result computed in float32 (an
              # approximation, a constant) is off by ~1e-7 relative, and fails.
              torch.float64: dict(rtol=1e-9, atol=1e-12),
              # Integer and bool inputs: assert_close's defaults for each result's dtype
              # (exact for integers and bools; a float result, sqrt(int), at fp32's).
              torch.int64: {}, torch.int32: {}, torch.int16: {}, torch.int8: {},
              torch.uint8: {}, torch.bool: {}}
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.complex64: "c64",
               torch.int64: "i64", torch.int32: "i32", torch.uint8: "u8", torch.bool: "b8",
               # the unsupported-dtype sweep's others (unsupported.py)
               torch.int8: "i8", torch.int16: "i16", torch.float16: "f16", torch.float64: "f64"}
#: Each dtype's name (the sweep's --dtypes, the results' "dtype").
DTYPES_BY_NAME = {name: dtype for dtype, name in DTYPE_NAMES.items()}


@dataclasses.dataclass
class Result:
    """The verdict for one (entry, path, dtype)."""
    op: str            # the OpInfo name, with ".variant" when there is one
    path: str          # "compile", "eager" or "fuse" (paths.PATHS)
    dtype: str         # "fp32", "bf16", "c64" (DTYPE_NAMES)
    status: str        # pass | fallback | fail | skip | n/a
    detail: str = ""   # why (fail, fallback, skip), or a note on a pass
    category: str = ""  # skips: xla-unsupported | ours | test-artifact; fallbacks: the same
    samples: int = 0   # samples checked
    fallback_ops: dict = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def entry_name(op) -> str:
    """``"op"`` or ``"op.variant"``, the key used by the skip list and the coverage table."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _clone(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


def _sample_call(sample):
    """(args, kwargs) of a SampleInput, tensors cloned so no side sees the other's writes."""
    args = tree_map(_clone, (sample.input, *sample.args))
    kwargs = tree_map(_clone, dict(sample.kwargs))
    return args, kwargs


#: Entries whose complex results are logarithms, defined up to a multiple of 2*pi*i: the branch
#: a sum of logarithms lands on depends on the order it is summed in (logcumsumexp's scan is
#: associative on XLA, sequential in the CPU kernel), so imaginary parts are compared modulo
#: 2*pi.
COMPLEX_LOGARITHMS = frozenset({"logcumsumexp"})


def _on_expected_branch(actual, expected):
    """``actual`` with each imaginary part moved by the multiple of 2*pi that brings it nearest
    ``expected``'s (complex tensors only; anything else as it is)."""
    def move(a, e):
        if not (isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) and a.is_complex()
                and e.is_complex() and a.shape == e.shape):
            return a
        turns = torch.round((a.imag - e.imag) / (2 * torch.pi)).nan_to_num(0.0)
        return torch.complex(a.real, a.imag - turns * 2 * torch.pi)
    a_flat, spec = tree_flatten(actual)
    e_flat, e_spec = tree_flatten(expected)
    if spec != e_spec:
        return actual
    return spec.unflatten([move(a, e) for a, e in zip(a_flat, e_flat)])


def _compare(actual, expected, dtype, reference_fp32=None, what="output"):
    """Raise AssertionError naming the first mismatch; a wider reference (fp32 for bf16, fp64
    for fp32) rescues rounding where eager rounds more."""
    tol = TOLERANCES[dtype]
    actual_flat, actual_spec = tree_flatten(actual)
    expected_flat, expected_spec = tree_flatten(expected)
    if actual_spec != expected_spec:
        raise AssertionError(f"{what} structure {actual_spec} instead of {expected_spec}")
    ref_flat = tree_flatten(reference_fp32)[0] if reference_fp32 is not None else None
    for i, (a, e) in enumerate(zip(actual_flat, expected_flat)):
        if not isinstance(e, torch.Tensor):
            if isinstance(e, float) and isinstance(a, float):
                torch.testing.assert_close(a, e, **tol, equal_nan=True)
            elif a != e:
                raise AssertionError(f"{what} {i}: {a!r} instead of {e!r}")
            continue
        try:
            torch.testing.assert_close(a, e, **tol, equal_nan=True,
                                       msg=lambda m, i=i: f"{what} {i}: {m}")
        except AssertionError:
            # XLA keeps bf16 intermediates in f32 where CPU kernels round each step: a result
            # within tolerance of the wider answer is a pass.
            if ref_flat is None or not isinstance(ref_flat[i], torch.Tensor):
                raise
            wide = ref_flat[i]
            ref = wide.to(e.dtype) if wide.is_floating_point() or wide.is_complex() else wide
            if a.shape != ref.shape or a.dtype != e.dtype:
                raise
            try:
                torch.testing.assert_close(
                    a, ref, **tol, equal_nan=True,
                    msg=lambda m, i=i: f"{what} {i} (against the wider reference): {m}")
            except AssertionError:
                # Elementwise tolerances fail where a result cancels (a bf16 convolution's
                # rounding before its bias is added): then, as torch._dynamo.utils.same judges
                # low-precision results against a higher-precision one, compare root-mean-square
                # errors, with multiplier 1 where same() allows 3.
                if not _as_close_as_eager(a, e, ref_flat[i]):
                    raise


def _as_close_as_eager(actual, eager, exact) -> bool:
    """Whether ``actual`` is no farther from ``exact`` (the wider answer) than ``eager`` (eager
    CPU at the same precision), in root-mean-square error over ``exact``'s finite elements;
    a NaN or infinity where ``exact`` is finite fails."""
    if not (actual.is_floating_point() and exact.is_floating_point()):
        return False
    finite = exact.isfinite()
    if not finite.any():
        return False
    errors = []
    for value in (actual, eager):
        diff = value.double()[finite] - exact.double()[finite]
        if not diff.isfinite().all():
            errors.append(float("inf"))
        else:
            errors.append(diff.pow(2).mean().sqrt().item())
    return errors[0] <= errors[1]


#: The dtype a sample's wider reference is computed in.
_WIDER = {torch.bfloat16: torch.float32, torch.float32: torch.float64,
          torch.complex64: torch.complex128}


def _wider_reference(fn, args, kwargs, dtype=torch.bfloat16):
    """(the op's result, its arguments after the call) on copies of ``dtype`` inputs in the
    next wider dtype (bf16: fp32; fp32: fp64), or (None, None) when that is not meaningful."""
    wide = _WIDER[dtype]

    def up(value):
        if isinstance(value, torch.Tensor) and value.dtype is dtype:
            return value.to(wide)
        if isinstance(value, torch.dtype) and value is dtype:
            return wide
        return value
    args, kwargs = tree_map(up, (args, kwargs))
    try:
        return fn(*args, **kwargs), (args, kwargs)
    except Exception:
        return None, None


def _samples(op, dtype, max_samples: int, reference: bool = False):
    """The first ``max_samples`` (0: all) of the op's ``sample_inputs``, or of its
    ``reference_inputs`` (the sample inputs, then for many ops more: extremal values,
    broadcasting, noncontiguous layouts and larger shapes)."""
    inputs = op.reference_inputs if reference else op.sample_inputs
    samples = []
    for sample in inputs("cpu", dtype, requires_grad=False):
        samples.append(sample)
        if len(samples) == max_samples:
            break
    return samples


def check(op, path: str, dtype: torch.dtype, max_samples: int = 3,
          reference: bool = False) -> Result:
    """Run the first ``max_samples`` samples (0: all) of OpInfo ``op`` on ``path`` and compare
    with eager; ``reference``: from ``op.reference_inputs`` instead of ``op.sample_inputs``.

    Example::

        from torch.testing._internal.common_methods_invocations import op_db
        add = next(o for o in op_db if o.name == "add")
        check(add, "compile", torch.float32).status   # "pass"
    """
    name = entry_name(op)
    result = Result(name, path, DTYPE_NAMES[dtype], "pass")
    if dtype not in op.supported_dtypes("cpu"):
        result.status, result.detail = "n/a", "dtype not supported by the op on CPU"
        return result
    if skipped(result):
        return result

    start = time.perf_counter()
    run = paths.PATHS[path]
    fn = op.op
    notes = []
    try:
        for index, sample in enumerate(_samples(op, dtype, max_samples, reference)):
            args, kwargs = _sample_call(sample)
            torch.manual_seed(index)  # random ops draw from torch's generator on both sides
            expected = fn(*args, **kwargs)
            expected_arguments = (args, kwargs)
            reference, reference_arguments = _wider_reference(fn, *_sample_call(sample)) \
                if dtype is torch.bfloat16 else (None, None)
            args, kwargs = _sample_call(sample)
            torch.manual_seed(index)
            outcome = run(fn, args, kwargs)
            if dtype is torch.complex64 and name in COMPLEX_LOGARITHMS:
                outcome.value = _on_expected_branch(outcome.value, expected)
            try:
                _compare(outcome.value, expected, dtype, reference)
            except AssertionError:
                if dtype not in (torch.float32, torch.complex64):
                    raise
                # fp32 too: a result that cancels, nearer the fp64 answer than eager's, passes
                # (matrix_exp through JAX's Pade approximant against LAPACK-free CPU code).
                torch.manual_seed(index)
                reference, _ = _wider_reference(fn, *_sample_call(sample), dtype)
                _compare(outcome.value, expected, dtype, reference)
            # What the op wrote into its arguments (in-place ops, out=, batch norm's running
            # statistics, whose schema does not even declare the write) counts as output.
            _compare(outcome.arguments, expected_arguments, dtype, reference_arguments,
                     what="argument")
            count_sample(result, outcome, notes)
    except Exception as exc:  # every failure becomes a row of the table, named
        result.status = "fail"
        result.detail = _one_line(exc)
        result.seconds = time.perf_counter() - start
        return result
    return conclude(result, start, notes, "OpInfo yields no samples for this dtype")


def count_sample(result: Result, outcome, notes: list) -> None:
    """One more sample that matched eager: its fallback ops, graph breaks and graphs noted."""
    result.samples += 1
    result.fallback_ops.update(outcome.fallbacks)
    if outcome.graph_breaks:
        notes.append(f"graph break: {outcome.graph_breaks[0]}")
    if result.path == "compile" and outcome.graphs == 0:
        notes.append("Dynamo ran it eagerly (no graph)")


def skipped(result: Result, table=None) -> bool:
    """Whether ``result``'s entry is not run on its path and dtype: listed in the skip list
    (``table``: OpInfo's by default), or the path unavailable here; ``result`` says why."""
    listed = skips.lookup(result.op, result.path, result.dtype, table)
    why_not = paths.unavailable(result.path)
    if listed is not None:
        result.status, result.category, result.detail = "skip", listed.category, listed.reason
    elif why_not:
        result.status, result.category, result.detail = "skip", "unavailable", why_not
    return listed is not None or bool(why_not)


def conclude(result: Result, start: float, notes: list, no_samples: str) -> Result:
    """``result`` once every sample passed: its time since ``start``, and "skip" (with
    ``no_samples`` as the reason) where there were none, "fallback" where a sample ran a
    fallback op or left a note (a graph break), else "pass"."""
    result.seconds = time.perf_counter() - start
    if result.samples == 0:
        result.status, result.category = "skip", "test-artifact"
        result.detail = no_samples
    elif result.fallback_ops or notes:
        result.status = "fallback"
        parts = [f"{op} ({why})" for op, why in sorted(result.fallback_ops.items())]
        result.detail = "; ".join(parts + sorted(set(notes)))
        result.category = fallback_category(result.fallback_ops, notes)
    return result


_DATA_DEPENDENT = ("depends on tensor data", "Data dependent operator", "Dynamic shape operator",
                   "data-dependent", "sparse", "depends on the data")


def fallback_category(fallbacks: dict, notes: list) -> str:
    """Why an entry fell back: ``xla-unsupported`` (data-dependent shapes or values, sparse
    layouts), ``ours`` (an op we do not lower yet), or ``dynamo`` (Dynamo runs the call
    eagerly whatever the backend)."""
    # "no graph" only says that Dynamo ran everything eagerly; the graph break says why.
    reasons = list(fallbacks.values()) or [n for n in notes if not n.startswith("Dynamo ran")]
    if reasons and all(any(mark in why for mark in _DATA_DEPENDENT) for why in reasons):
        return "xla-unsupported"
    return "ours" if fallbacks else "dynamo"


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def format_traceback(exc: BaseException) -> str:
    """The full traceback of ``exc`` (for ``--verbose`` sweeps)."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
