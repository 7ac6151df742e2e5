"""The checks run before decompositions (torchtpu_compile/lower/decompositions/checks.py):
reductions over no elements, on the eager tpu device and the compile path, against eager CPU:
where eager raises (no identity: max, min, argmax, amax, median over a dim, mode, ...) we raise,
where it returns a value (NaN variance, a median of nothing) we return that value."""

import pytest
import torch

import torchtpu_eager  # noqa: F401
from tests.support.helpers import compile_tpu
from torchtpu_compile import config

pytestmark = pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0")

# name -> (function of the input, input shape); each function reduces over an empty extent.
CASES = {
    "max()": (lambda x: x.max(), (0,)),
    "min()": (lambda x: x.min(), (2, 0)),
    "max(dim)": (lambda x: x.max(0), (0, 3)),
    "min(dim=-2, keepdim)": (lambda x: x.min(-2, keepdim=True), (0, 3)),
    "max(dim) of a 3-d": (lambda x: torch.max(x, dim=1), (2, 0, 3)),
    "argmax()": (lambda x: x.argmax(), (0,)),
    "argmin(dim)": (lambda x: x.argmin(0), (0, 3)),
    "amax()": (lambda x: x.amax(), (0, 3)),
    "amin(dims)": (lambda x: x.amin((1, 0)), (0, 3)),
    "aminmax()": (lambda x: torch.aminmax(x), (0,)),
    "aminmax(dim)": (lambda x: torch.aminmax(x, dim=0), (0, 3)),
    "mode(dim)": (lambda x: x.mode(0), (0, 3)),
    "kthvalue(dim)": (lambda x: x.kthvalue(1, 0), (0, 3)),
    # eager returns values for these (a median of nothing: test_median_of_nothing below)
    "var()": (lambda x: x.var(), (0,)),
    "std(dim)": (lambda x: x.std(0), (0, 3)),
    "var(correction=2) of one": (lambda x: x.var(correction=2), (1,)),
    "std_mean()": (lambda x: torch.std_mean(x), (0,)),
    "var_mean(dim, correction=3)": (lambda x: torch.var_mean(x, 1, correction=3), (2, 2)),
    "max(dim) over a nonempty dim": (lambda x: x.max(1), (0, 3)),
    "amax over a nonempty dim": (lambda x: x.amax(1), (0, 3)),
}
# Cases whose lowering took torch-mlir down (an empty gather: a process abort): each test of
# them runs in a subprocess (tests/slow/test_decompositions_full.py).
MEDIANS = {
    "median(dim)": (lambda x: x.median(0), (0, 3)),
    "nanmedian(dim)": (lambda x: x.nanmedian(0), (0, 3)),
    "median(dim) over a nonempty dim": (lambda x: x.median(1), (0, 3)),
}


def _input(shape, dtype):
    return torch.arange(torch.Size(shape).numel()).reshape(shape).to(dtype) + 0.5 \
        if dtype.is_floating_point else torch.arange(torch.Size(shape).numel()).reshape(shape)


def _outcome(fn, x):
    try:
        out = fn(x)
    except (RuntimeError, IndexError) as exc:
        return exc
    return tuple(o.cpu() for o in out) if isinstance(out, tuple) else out.cpu()


def _expected(name, dtype=torch.float32):
    fn, shape = {**CASES, **MEDIANS}[name]
    return fn, _input(shape, dtype), _outcome(fn, _input(shape, dtype))


def _assert_same_values(got, want):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, equal_nan=True)
    else:
        torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("name", list(CASES))
def test_eager_device_matches_cpu(name):
    check_eager_device(name)


def check_eager_device(name):
    fn, x, want = _expected(name)
    got = _outcome(fn, x.to("tpu"))
    if isinstance(want, Exception):
        assert isinstance(got, type(want)), f"eager CPU raised {want!r}; tpu gave {got!r}"
        assert str(got) == str(want)
    else:
        _assert_same_values(got, want)


@pytest.mark.parametrize("name", ["max()", "max(dim)", "argmax()", "amin(dims)", "mode(dim)"])
def test_eager_device_raises_eagers_error_in_strict_mode_too(name):
    """Eager's error is not an op that cannot lower: TORCHTPU_STRICT=1 does not replace it."""
    fn, x, want = _expected(name)
    with config.patch(strict=True):
        got = _outcome(fn, x.to("tpu"))
    assert isinstance(got, type(want)) and str(got) == str(want)


@pytest.mark.parametrize("name", list(CASES))
def test_compile_path_matches_cpu(name):
    check_compile_path(name)


def check_compile_path(name):
    fn, x, want = _expected(name)
    compiled = compile_tpu(fn, dynamic=False)
    if isinstance(want, Exception):
        # Raised while compiling, as Inductor does; PyTorch's fake-tensor checks (argmax, amax,
        # aminmax) raise before the backend sees the graph, with their own wording.
        with pytest.raises((RuntimeError, IndexError)):
            compiled(x)
    else:
        _assert_same_values(_outcome(compiled, x), want)


@pytest.mark.parametrize("name", ["max()", "min()", "max(dim)", "mode(dim)"])
def test_compile_path_raises_eagers_exception_itself_at_each_call(name):
    # Found while compiling, it reached the caller as Dynamo's BackendCompilerFailed (all but
    # an IndexError are wrapped): `except RuntimeError` caught it, `type(e)` was not eager's.
    fn, x, want = _expected(name)
    compiled = compile_tpu(fn, dynamic=False)
    for _ in range(2):
        got = _outcome(compiled, x)
        assert isinstance(got, type(want)), f"eager CPU raised {want!r}; compiled {got!r}"
        assert not isinstance(got, torch._dynamo.exc.TorchDynamoException)
        assert str(got) == str(want)


def test_an_integer_to_a_negative_power_raises_eagers_error():
    # torch-mlir computed it (2 ** -1 gave 0); eager's meta function refuses it.
    x = torch.tensor([1, 2, 3])
    fn = lambda x: x ** -1  # noqa: E731
    want = _outcome(fn, x)
    got = _outcome(fn, x.to("tpu"))
    assert isinstance(got, RuntimeError) and str(got) == str(want)
    with pytest.raises(RuntimeError, match="Integers to negative integer powers"):
        compile_tpu(fn, dynamic=False)(x)
    torch.testing.assert_close(_outcome(lambda x: x ** -1.0, x.to("tpu")), x ** -1.0)


@pytest.mark.parametrize("fn", [lambda m: m - 0, lambda m: 1 - m, lambda m: m - m],
                         ids=["mask - 0", "1 - mask", "mask - mask"])
def test_a_bool_subtracted_raises_eagers_error(fn):
    # Eager's sub_check; traced, a bool minus a number was computed on 0 and 1.
    mask = torch.tensor([True, False])
    want = _outcome(fn, mask)
    got = _outcome(fn, mask.to("tpu"))
    assert isinstance(want, RuntimeError) and isinstance(got, RuntimeError)
    assert str(got) == str(want)


def test_an_integer_bound_that_overflows_raises_eagers_error():
    # Eager converts a Python integer bound to the tensor's integer dtype and raises where it
    # overflows; traced, clamp(-1, 300) of uint8 returned values. An unsigned bound down to
    # -max wraps, as in eager, and float bounds promote.
    x = torch.arange(0, 250, 20, dtype=torch.uint8)
    for fn in (lambda x: x.clamp(-1, 300), lambda x: x.to(torch.int8).clamp(0, 200)):
        want = _outcome(fn, x)
        got = _outcome(fn, x.to("tpu"))
        assert isinstance(got, RuntimeError) and str(got) == str(want)
    with pytest.raises(RuntimeError, match="without overflow"):
        compile_tpu(lambda x: x.clamp(max=300), dynamic=False)(x)
    for fn in (lambda x: x.clamp(-255, 255), lambda x: x.clamp(1.5, 300.0)):
        torch.testing.assert_close(_outcome(fn, x.to("tpu")), fn(x))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_a_float_bound_beyond_the_dtypes_range_raises_eagers_error(dtype):
    # Eager converts a clamp bound to the tensor's float dtype and raises where it is finite
    # and beyond the dtype's range (half and 70000, even 65504.5); traced, it saturated. On
    # the eager device a float32 clamp's bound becomes a program input after two values:
    # later bounds beyond float32's range must still raise.
    x = torch.tensor([0.5, 2.5, -3.0]).to(dtype)
    big = torch.finfo(dtype).max * 1.01
    bounds = (0.5, 0.25, 65504.5, 7e4, big, -big, float("inf"), float("nan"), 1e300, 0.75)
    for bound in bounds:
        for fn in (lambda x, b=bound: x.clamp(max=b), lambda x, b=bound: x.clone().clamp_(min=-b),
                   lambda x, b=bound: torch.clamp_min(x, b)):
            want = _outcome(fn, x)
            got = _outcome(fn, x.to("tpu"))
            if isinstance(want, RuntimeError):
                assert isinstance(got, RuntimeError) and str(got) == str(want), bound
            else:
                torch.testing.assert_close(got, want, equal_nan=True)
    with pytest.raises(RuntimeError, match="without overflow"):
        compile_tpu(lambda x: x.clamp(max=big), dynamic=False)(x)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.bool])
def test_an_integer_round_with_decimals_raises_eagers_error(dtype):
    # Eager's round with decimals has float kernels only; traced, an integer tensor was scaled,
    # rounded and scaled back. Round without decimals stays the identity on integers, and
    # has no bool kernel either.
    x = torch.tensor([1, 0, 3]).to(dtype)
    for fn in (lambda x: x.round(decimals=1), lambda x: torch.round(x, decimals=0)):
        assert isinstance(_outcome(fn, x), NotImplementedError)
        with pytest.raises(NotImplementedError, match="round"):
            fn(x.to("tpu")).cpu()
        # eager's own exception (dtype_support.py), at every call of the compiled function
        with pytest.raises(NotImplementedError, match=r'"round\w*" not implemented'):
            compile_tpu(fn, dynamic=False)(x)
    if dtype == torch.bool:
        with pytest.raises(NotImplementedError, match="round"):
            x.to("tpu").round().cpu()
    else:
        torch.testing.assert_close(x.to("tpu").round().cpu(), x.round())


# Inputs eager's kernels refuse, beyond what their meta functions check: traced, each gave a
# value (the weight promoted, the source broadcast, the scatter's far elements dropped).
REFUSED = {
    "nll_loss with an fp16 weight": (
        lambda x, t, w: torch.nn.functional.nll_loss(x, t, weight=w),
        lambda: (torch.randn(3, 4), torch.tensor([0, 1, 2]), torch.ones(4).half())),
    "nll_loss2d with an fp64 weight": (
        lambda x, t, w: torch.nn.functional.nll_loss(x, t, weight=w),
        lambda: (torch.randn(2, 4, 3, 3), torch.zeros(2, 3, 3, dtype=torch.int64),
                 torch.ones(4, dtype=torch.float64))),
    "index_add of a source of another shape": (
        lambda x, i, s: torch.index_add(x, 0, i, s),
        lambda: (torch.zeros(3, 2), torch.tensor([0, 1]), torch.ones(2))),
    "index_add of a source of another dtype": (  # fuzz seed 4582
        lambda x, i, s: torch.index_add(x, 0, i, s),
        lambda: (torch.tensor([[True, False]]), torch.tensor([0]), torch.tensor([[1, 0]]) * 2)),
    "index_add_ of a float source into float64": (
        lambda x, i, s: x.clone().index_add_(0, i, s),
        lambda: (torch.zeros(3, 2, dtype=torch.float64), torch.tensor([0, 2]), torch.ones(2, 2))),
    "as_strided_scatter beyond the input": (
        lambda x, s: torch.as_strided_scatter(x, s, [2, 2], [200, 200], 0),
        lambda: (torch.zeros(4, 4), torch.ones(2, 2))),
    # Operands of other dtypes eager's kernels refuse, which a trace promoted (a real
    # DDPM script with a float64 model and a float32 time embedding ran on).
    "linear of a bf16 weight and bias on a float32 input": (
        torch.nn.functional.linear,
        lambda: (torch.randn(2, 4), torch.randn(3, 4).bfloat16(), torch.randn(3).bfloat16())),
    "addmm of a float64 bias": (
        torch.addmm, lambda: (torch.randn(3).double(), torch.randn(2, 4), torch.randn(4, 3))),
    "layer_norm of float64 parameters on a float32 input": (
        lambda x, w, b: torch.nn.functional.layer_norm(x, (4,), w, b),
        lambda: (torch.randn(2, 4), torch.ones(4).double(), torch.zeros(4).double())),
    "layer_norm of bf16 parameters on a float32 input": (
        lambda x, w, b: torch.nn.functional.layer_norm(x, (4,), w, b),
        lambda: (torch.randn(2, 4), torch.ones(4).bfloat16(), torch.zeros(4).bfloat16())),
    "layer_norm of float32 parameters on a float64 input": (
        lambda x, w, b: torch.nn.functional.layer_norm(x, (4,), w, b),
        lambda: (torch.randn(2, 4).double(), torch.ones(4), torch.zeros(4))),
    "layer_norm of a bf16 weight and a float32 bias on a bf16 input": (
        lambda x, w, b: torch.nn.functional.layer_norm(x, (4,), w, b),
        lambda: (torch.randn(2, 4).bfloat16(), torch.ones(4).bfloat16(), torch.zeros(4))),
    "group_norm of float64 parameters on a float32 input": (
        lambda x, w, b: torch.nn.functional.group_norm(x, 2, w, b),
        lambda: (torch.randn(2, 4, 3), torch.ones(4).double(), torch.zeros(4).double())),
    "index_copy of a bf16 source": (
        lambda x, i, s: x.index_copy(0, i, s),
        lambda: (torch.zeros(3, 4), torch.tensor([0, 2]), torch.ones(2, 4).bfloat16())),
    "full_like of int8 with 300": (
        lambda x: torch.full_like(x, 300), lambda: (torch.zeros(3, dtype=torch.int8),)),
    "full_like of half with 1e5": (
        lambda x: torch.full_like(x, 1e5), lambda: (torch.zeros(3, dtype=torch.half),)),
    "where of int8 and 300": (
        lambda m, x: torch.where(m, x, 300),
        lambda: (torch.tensor([True, False, True]), torch.zeros(3, dtype=torch.int8))),
    "masked_fill of int8 with 300": (
        lambda x, m: x.masked_fill(m, 300),
        lambda: (torch.zeros(3, dtype=torch.int8), torch.tensor([True, False, True]))),
    "index_put of bf16 values": (
        lambda x, i, v: x.index_put((i,), v, accumulate=True),
        lambda: (torch.zeros(3, 4), torch.tensor([0, 2]), torch.ones(2, 4).bfloat16())),
}
ACCEPTED = {
    "index_add along dim 1": (lambda x, i, s: torch.index_add(x, 1, i, s),
                              lambda: (torch.zeros(3, 2), torch.tensor([1, 0]),
                                       torch.ones(3, 2))),
    "index_add of 0-d": (lambda x, i, s: torch.index_add(x, 0, i, s),
                         lambda: (torch.zeros(()), torch.tensor([0]), torch.ones(()))),
    "as_strided_scatter within the input": (
        lambda x, s: torch.as_strided_scatter(x, s, [2, 2], [4, 1], 10),
        lambda: (torch.zeros(4, 4), torch.ones(2, 2))),
    "masked_fill of uint8 with -1 (wraps, as c10 allows)": (
        lambda x, m: x.masked_fill(m, -1),
        lambda: (torch.zeros(3, dtype=torch.uint8), torch.tensor([True, False, True]))),
    "layer_norm of float32 parameters on a bf16 input": (
        lambda x, w, b: torch.nn.functional.layer_norm(x, (4,), w, b),
        lambda: (torch.randn(2, 4).bfloat16(), torch.ones(4), torch.zeros(4))),
    "group_norm of float32 parameters on a half input": (
        lambda x, w, b: torch.nn.functional.group_norm(x, 2, w, b),
        lambda: (torch.randn(2, 4, 3).half(), torch.ones(4), torch.zeros(4))),
    "nll_loss with a weight of its dtype": (
        lambda x, t, w: torch.nn.functional.nll_loss(x, t, weight=w),
        lambda: (torch.randn(3, 4), torch.tensor([0, 1, 2]), torch.rand(4))),
}


def _seeded(make):
    """``make`` called after seeding: the same random inputs at each call."""
    def inputs():
        torch.manual_seed(0)
        return make()
    return inputs


@pytest.mark.parametrize("name", list(REFUSED))
def test_inputs_eagers_kernel_refuses_raise_its_error(name):
    fn, inputs = REFUSED[name][0], _seeded(REFUSED[name][1])
    want = _outcome(lambda args: fn(*args), inputs())
    assert isinstance(want, RuntimeError)
    got = _outcome(lambda args: fn(*args), [t.to("tpu") for t in inputs()])
    assert isinstance(got, RuntimeError) and str(got) == str(want)
    with pytest.raises(RuntimeError) as compiled:
        compile_tpu(fn, dynamic=False)(*inputs())
    # Ours, or Dynamo's fake tensors first (as_strided_scatter's prim, in its own words).
    assert str(want) in str(compiled.value) or "fake tensor" in str(compiled.value)


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_inputs_eager_accepts_still_run(name):
    fn, inputs = ACCEPTED[name][0], _seeded(ACCEPTED[name][1])
    want = fn(*inputs())
    torch.testing.assert_close(fn(*[t.to("tpu") for t in inputs()]).cpu(), want)
    torch.testing.assert_close(compile_tpu(fn, dynamic=False)(*inputs()), want)


# index_copy and index_fill into a dim of size 0: eager's kernels restride an empty storage to
# the index's length and fail there, with RuntimeError whatever the index (fuzz5's probe of
# seed 5182: ours raised the index check's IndexError); into another empty dim they return.
INDEX_INTO_EMPTY = {
    "index_copy into (0, 3)": (lambda x, i: x.index_copy(0, i, torch.ones(2, 3, device=x.device)),
                               (0, 3)),
    "index_fill_ into (2, 0, 3) dim 1": (lambda x, i: x.index_fill_(1, i, 1.0), (2, 0, 3)),
    "index_fill of a tensor value": (lambda x, i: x.index_fill(0, i, torch.tensor(2.0)), (0,)),
    "index_fill into (2, 0) dim 0": (lambda x, i: x.index_fill(0, i, 1.0), (2, 0)),
}


@pytest.mark.parametrize("name", list(INDEX_INTO_EMPTY))
def test_an_index_into_an_empty_dim_raises_eagers_error(name):
    fn, shape = INDEX_INTO_EMPTY[name]
    index = torch.tensor([0, 5])
    want = _outcome(lambda x: fn(x, index), torch.zeros(shape))
    got = _outcome(lambda x: fn(x, index.to("tpu")), torch.zeros(shape, device="tpu"))
    compiled = _outcome(lambda x: compile_tpu(fn, dynamic=False)(x, index), torch.zeros(shape))
    for outcome in (got, compiled):
        if isinstance(want, Exception):
            assert isinstance(outcome, RuntimeError) and not isinstance(outcome, IndexError)
            assert str(want) in str(outcome)
        else:
            _assert_same_values(outcome, want)
