"""Python ints in an op's Scalar and Tensor slots are program inputs on the tpu device, as floats
are (``torchtpu_eager/scalars.py``): ``x * i``, ``loss / n``, ``pos + i`` over a loop compile a
program per range and sign of ``i``, not one per value. Values, dtypes and errors stay eager's
on the CPU at every value: wraparound, 0-dim promotion, division by 0, overflow checks."""
import pytest
import torch

import torchtpu_compile
import torchtpu_eager  # noqa: F401

torch.manual_seed(0)
X = torch.randn(4, 3)
I32 = torch.tensor([5, -7, 100, -2 ** 31, 2 ** 31 - 1], dtype=torch.int32)
U8 = torch.tensor([0, 1, 200, 255], dtype=torch.uint8)
B = torch.tensor([True, False, True])
Z32 = torch.tensor(3, dtype=torch.int32)
H = torch.tensor([1.0, -2.5, 60000.0], dtype=torch.half)
INPUTS = (X, I32, U8, B, Z32, H)


def _compiled() -> int:
    """Single-op programs compiled. Defer-and-fuse's fused programs are left out: which
    recordings it fuses depends on what ran before in the process (a ``/ 7`` with an exact
    program from an earlier test, kaiser_window's, records as a constant, not an input)."""
    stats = torchtpu_compile.stats()
    fused = stats["fused_graphs_run"] - stats["fused_graph_cache_hits"]
    return stats["eager_programs_compiled"] - fused



def _same_as_eager(fn, i):
    """``fn`` on the tpu copies of INPUTS and ``i`` gives eager's value and dtype, or raises
    eager's exception type. Integer and bool results are equal; float ones close (the CPU
    client's float division is not correctly rounded: ``x / 3`` is 1 ulp off either way)."""
    try:
        expected = fn(*INPUTS, i)
    except Exception as exc:  # noqa: BLE001  (whatever eager raises, the device must too)
        with pytest.raises(type(exc)):
            fn(*[t.to("tpu") for t in INPUTS], i).cpu()
        return
    got = fn(*[t.to("tpu") for t in INPUTS], i).cpu()
    assert got.dtype == expected.dtype, (i, got.dtype, expected.dtype)
    if expected.dtype.is_floating_point:
        torch.testing.assert_close(got, expected, msg=lambda m: f"{i}: {m}")
    else:
        assert torch.equal(got, expected), (i, got, expected)


LOOPS = {
    "float tensor times i": lambda x, a, u, b, z, h, i: x * i,
    "sum over i + 1": lambda x, a, u, b, z, h, i: x.sum() / (i + 1),
    "int32 plus i": lambda x, a, u, b, z, h, i: a + i,
    "i minus int32": lambda x, a, u, b, z, h, i: i - a,
    "int32 floor-divided by i": lambda x, a, u, b, z, h, i: a // i,
    "int32 modulo i": lambda x, a, u, b, z, h, i: a % i,
    "int32 div floor": lambda x, a, u, b, z, h, i: a.div(i, rounding_mode="floor"),
    "float div floor": lambda x, a, u, b, z, h, i: x.div(i, rounding_mode="floor"),
    "int32 true division": lambda x, a, u, b, z, h, i: a / i,
    "bool plus i": lambda x, a, u, b, z, h, i: b + i,
    "0-dim int32 plus i": lambda x, a, u, b, z, h, i: z + i,
    "int32 below i": lambda x, a, u, b, z, h, i: a < i,
    "clamp min": lambda x, a, u, b, z, h, i: torch.clamp(a, min=i),
    "add alpha": lambda x, a, u, b, z, h, i: a.add(a, alpha=i),
    "in place": lambda x, a, u, b, z, h, i: a.clone().add_(i),
}


@pytest.mark.parametrize("case", list(LOOPS))
@pytest.mark.parametrize("values", [range(2, 10), range(-2, -10, -1)], ids=["positive", "negative"])
def test_an_int_loop_compiles_once_per_range(case, values, eager_mode):
    fn = LOOPS[case]
    compiled = None
    for k, i in enumerate(values):
        if k == 2:  # the first value's program, then the lifted one
            compiled = _compiled()
        _same_as_eager(fn, i)
    assert _compiled() - compiled == 0


EDGES = {
    # each after values that lift the op: the edge must still be eager's
    "uint8 wraps": (lambda x, a, u, b, z, h, i: u + i, [300, 301, 511, 256, 1000, -1, -3]),
    "int32 wraps": (lambda x, a, u, b, z, h, i: a + i, [2 ** 40, 2 ** 40 + 3, 2 ** 33 + 1]),
    "int32 times beyond its range": (lambda x, a, u, b, z, h, i: a * i, [2 ** 33, 2 ** 33 + 7]),
    "division by 0": (lambda x, a, u, b, z, h, i: a // i, [3, 5, 0, -2, -3, 0]),
    "modulo 0": (lambda x, a, u, b, z, h, i: a % i, [3, 5, 0]),
    "div floor by 0": (lambda x, a, u, b, z, h, i: a.div(i, rounding_mode="floor"), [3, 5, 0]),
    "true division by 0": (lambda x, a, u, b, z, h, i: a / i, [3, 5, 0]),
    "half overflows": (lambda x, a, u, b, z, h, i: h * i, [2, 3, 70000, 70001, 65504]),
    "uint8 clamp beyond its range": (lambda x, a, u, b, z, h, i: u.clamp(min=i),
                                     [3, 5, 300, 301, -1, -2]),
    "pow": (lambda x, a, u, b, z, h, i: x.pow(i), [2, 3, 4, -1, -2]),
    "int pow": (lambda x, a, u, b, z, h, i: a.pow(i), [2, 3, 4]),
    "bool and i": (lambda x, a, u, b, z, h, i: b & i, [1, 2, 3]),
    "fmod": (lambda x, a, u, b, z, h, i: a.fmod(i), [3, 5, -3, -5]),
}


@pytest.mark.parametrize("case", list(EDGES))
def test_ints_as_inputs_keep_eagers_values_and_errors(case, eager_mode):
    fn, values = EDGES[case]
    for i in values:
        _same_as_eager(fn, i)
