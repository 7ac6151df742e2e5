"""Int positions are program inputs on the tpu device: ``x[t]``, ``x[i:i + n]``, ``narrow``,
``split``'s pieces, writes through them, their gradients and ``roll`` compile one program per
shape, not one per position (forward_forward compiled 150 programs for ``y_neg[idx] = ...``).
Values and errors are eager's on the CPU, at every position, negative ones included, in every
mode."""
import re

import pytest
import torch

import torchtpu_compile
import torchtpu_eager  # noqa: F401
from tests.support.helpers import eager_mode

torch.manual_seed(0)
X = torch.randn(6, 5)
NARROW_STARTS = [-5, -4, -3, -2, 0, 1, 2, 3]   # of length 2, in a dim of 5


def _compiled() -> int:
    return torchtpu_compile.stats()["eager_programs_compiled"]


@pytest.fixture(params=["strict", "debug", "defer_and_fuse"])
def mode(request):
    with eager_mode(request.param):
        yield request.param


def _no_program_per_position(fn, positions):
    """``fn(position)`` (a host tensor, or a tuple of them) at each position; the programs
    compiled after the first two positions, which may compile the shape's own."""
    compiled = None
    for k, i in enumerate(positions):
        if k == 2:
            compiled = _compiled()
        fn(i)
    return _compiled() - compiled


READS = {
    "select a row": (lambda x, i: x[i] * 2, range(-6, 6)),
    "select a column": (lambda x, i: x[:, i] + 1, range(-5, 5)),
    "select, read alone": (lambda x, i: x.select(0, i).clone(), range(-6, 6)),
    "slice of rows": (lambda x, i: x[i:i + 2].sum(0), range(0, 5)),
    "slice of columns, negative start": (lambda x, i: x[:, i - 5:i - 3] * 3, range(0, 4)),
    "narrow": (lambda x, i: x.narrow(1, i, 2) * 2 - 1, NARROW_STARTS),
    "split's pieces": (lambda x, i: x.split(1, dim=1)[i] * x[0], range(-5, 5)),
}


@pytest.mark.parametrize("case", list(READS))
def test_reads_at_every_position(case, mode):
    fn, positions = READS[case]
    xt = X.to("tpu")

    def check(i):
        torch.testing.assert_close(fn(xt, i).cpu(), fn(X, i), rtol=0, atol=0)

    assert _no_program_per_position(check, positions) == 0


@pytest.mark.parametrize("index", [lambda x: x[6], lambda x: x[-7], lambda x: x[:, 5],
                                   lambda x: x.select(1, -6), lambda x: x.narrow(0, 5, 2),
                                   lambda x: x.narrow(1, -6, 1)])
def test_positions_out_of_range_raise_as_eager(index, mode):
    with pytest.raises(Exception) as expected:
        index(X)
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
        index(X.to("tpu"))


WRITES = {  # (write, its positions: a view's shape is a program of its own)
    "a row": (lambda y, i: y.__setitem__(i, torch.arange(5.0) * i), range(-6, 6)),
    "a column, in place": (lambda y, i: y[:, i].add_(1.5), range(-5, 5)),
    "a block": (lambda y, i: y.__setitem__((slice(i, i + 2), slice(1, 3)), -y[i:i + 2, 3:]),
                range(0, 5)),
    "narrow, copied into": (lambda y, i: y.narrow(1, i, 2).copy_(y[:, :2] * 2), NARROW_STARTS),
    "one element of an int tensor": (lambda y, i: y.__setitem__(i, 7), range(-8, 8)),
}


@pytest.mark.parametrize("case", list(WRITES))
def test_writes_at_every_position(case, mode):
    fn, positions = WRITES[case]
    y = torch.arange(8) % 3 if case.endswith("int tensor") else X.clone()
    yt = y.to("tpu")

    def check(i):
        fn(y, i)
        fn(yt, i)
        torch.testing.assert_close(yt.cpu(), y, rtol=0, atol=0)

    assert _no_program_per_position(check, positions) == 0


GRADS = {  # (a function of a view, its positions)
    "select": (lambda x, i: x[i] * torch.arange(5.0, device=x.device), range(-6, 6)),
    "slice": (lambda x, i: x[i:i + 2, 1:4] ** 2, range(0, 5)),
    "narrow": (lambda x, i: x.narrow(1, i, 2) * x.narrow(1, i, 2), NARROW_STARTS),
}


@pytest.mark.parametrize("case", list(GRADS))
def test_gradients_at_every_position(case, mode):
    fn, positions = GRADS[case]
    xc = X.clone().requires_grad_()
    xt = X.to("tpu").requires_grad_()

    def check(i):
        fn(xc, i).sum().backward()
        fn(xt, i).sum().backward()
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-6, atol=1e-6)

    assert _no_program_per_position(check, positions) == 0


ROLLS = {
    "one dim": (lambda x, k: torch.roll(x, k, 0), range(-7, 8)),
    "two dims": (lambda x, k: torch.roll(x, (k, 2 * k), (1, -2)), range(-6, 6)),
    "flattened": (lambda x, k: torch.roll(x, k), range(-31, 31, 3)),
}


@pytest.mark.parametrize("case", list(ROLLS))
def test_roll_at_every_shift(case, mode):
    fn, shifts = ROLLS[case]
    xt = X.to("tpu")

    def check(k):
        torch.testing.assert_close(fn(xt, k).cpu(), fn(X, k), rtol=0, atol=0)

    assert _no_program_per_position(check, shifts) == 0


def test_roll_gradient_and_errors():
    xc = X.clone().requires_grad_()
    xt = X.to("tpu").requires_grad_()
    (torch.roll(xc, 2, 1) * torch.arange(5.0)).sum().backward()
    (torch.roll(xt, 2, 1) * torch.arange(5.0, device="tpu")).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=0, atol=0)
    for args in [(1, 2), ((1, 2), (0,)), ((1, 2),)]:
        with pytest.raises(Exception) as expected:
            torch.roll(X, *args)
        with pytest.raises(type(expected.value)):
            torch.roll(X.to("tpu"), *args)


FILLS = {  # (dtype, the values filled in turn: a program for all of them)
    torch.int64: [(i * 7) % 10 for i in range(12)],
    torch.float32: [i * 0.37 - 1 for i in range(12)],
    torch.int8: [3.7, -2.2, 127, -128, 5, True] * 2,
    torch.float16: [0.1, 1e-5, 65504.0, 2049, -0.3, 7] * 2,
    torch.bool: [2, 0, 0.5, True, False, -1] * 2,
}


@pytest.mark.parametrize("dtype", list(FILLS), ids=str)
def test_fill_values_are_inputs(dtype, mode):
    # y_neg[idx] = label (forward_forward): a value per call, converted as eager converts it
    y = torch.zeros(8, 3, dtype=dtype)
    yt = y.to("tpu")

    def check(k):
        value = FILLS[dtype][k]
        y[k % 8].fill_(value)
        yt[k % 8].fill_(value)
        y[:, k % 3] = value
        yt[:, k % 3] = value
        torch.testing.assert_close(yt.cpu(), y, rtol=0, atol=0)

    assert _no_program_per_position(check, range(12)) == 0
    with pytest.raises(RuntimeError, match="overflow"):
        torch.zeros(2, dtype=torch.int8).fill_(1000)
    with pytest.raises(RuntimeError, match="overflow"):
        torch.zeros(2, dtype=torch.int8).to("tpu").fill_(1000)


NEW_FACTORIES = {
    "new_zeros": lambda src: src.new_zeros(3, 4),
    "new_ones": lambda src: src.new_ones((3, 4), dtype=torch.int32),
    "new_full": lambda src: src.new_full((3, 4), 2.5),
}


@pytest.mark.parametrize("case", list(NEW_FACTORIES))
def test_new_factories_compile_per_requested_shape_not_per_source(case, mode):
    """``x.new_zeros(3, 4)`` of sources of other shapes is one result shape: traced as an op,
    its program took the source as an input and compiled once per source shape."""
    fn = NEW_FACTORIES[case]

    def check(rows):
        src = torch.randn(rows, 5)
        got = fn(src.to("tpu"))
        expected = fn(src)
        assert (got.dtype, got.shape) == (expected.dtype, expected.shape)
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)

    assert _no_program_per_position(check, range(4, 12)) == 0
