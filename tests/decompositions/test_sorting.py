"""The sort and selection decompositions (torchtpu_compile/lower/decompositions/sorting.py)
against eager CPU PyTorch, in strict mode: the op must run through XLA, not fall back, and give
eager's numbers (edge cases included: NaN, ties, signed zeros)."""
from __future__ import annotations

import pytest
import torch

from tests.support.decomposition_checks import INF, NAN, check, check_on_both_paths, randn
from tests.support.helpers import compile_tpu
from torchtpu_compile import config

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


TIES_AND_NANS = torch.tensor([[3.0, 1, 3, 1, 2, 2, 2, 5], [NAN, 1, NAN, 0, 0, 0, 0, 0],
                              [2, 2, 2, 2, 1, 1, 1, 1], [NAN, NAN, NAN, NAN, NAN, 4, NAN, NAN]])


# --- sorts -----------------------------------------------------------------------------------

def test_stable_sorts_keep_ties_in_order_and_every_sort_puts_nan_last():
    # torch-mlir's comparator left NaN unordered; sort(stable=True) did not lower. The
    # default sort stays unstable, as eager's (both are std::sort on the CPU).
    def sorts(x):
        return (torch.sort(x, stable=True), torch.sort(x, dim=0, descending=True, stable=True),
                torch.argsort(x, dim=1, stable=True))
    check_on_both_paths(sorts, TIES_AND_NANS)
    check(sorts, torch.tensor([[3, 1, 3, 1, 2], [0, 0, -1, 0, 5]]))
    # Without ties the default sort has one answer: NaN last ascending, first descending.
    distinct = torch.tensor([[3.0, NAN, -1, 2, INF, 0], [NAN, 1, -INF, 5, 4, -2]])
    check(lambda x: (torch.sort(x), torch.sort(x, descending=True)), distinct)


# --- topk ------------------------------------------------------------------------------------

TOPK_CASES = [  # (k as a fraction of the dim's size, largest, sorted)
    (0, True, True), (1, True, True), (0.5, True, True), (1.0, True, True),
    (1, False, True), (0.5, False, True), (1.0, False, True), (0.5, True, False),
    (0.5, False, False)]


def _topk_sweep(inputs, cases=TOPK_CASES):
    """topk of each input along each dim for each case (k = 1 means one element, a float a
    fraction of the dim): [((x, k, dim, largest, sorted), (values, indices))]."""
    results = []
    for x in inputs:
        for dim in range(x.dim()):
            n = x.shape[dim]
            for k, largest, sorted_ in cases:
                k = min(k, n) if isinstance(k, int) else int(k * n)
                out = torch.topk(x, k, dim - x.dim() if dim else dim, largest=largest,
                                 sorted=sorted_)
                results.append(((x, k, dim, largest, sorted_), tuple(out)))
    return results


def check_topk(*inputs, cases=TOPK_CASES, on_device=False):
    """torchtpu's topk (compiled, all in one graph; with ``on_device`` the eager tpu device
    too) against eager: the values of eager's topk, the indices of eager's stable sort (the
    lowest index first among equal values), each index pointing at its value."""
    with config.patch(strict=True, matmul_precision="highest"):
        ours = [compile_tpu(lambda *xs: [out for _, out in _topk_sweep(xs, cases)])(*inputs)]
        if on_device:
            ours.append([tuple(t.cpu() for t in out) for _, out in
                         _topk_sweep([x.to("tpu") for x in inputs], cases)])
    for i, ((x, k, dim, largest, sorted_), eager) in enumerate(_topk_sweep(inputs, cases)):
        stable = torch.sort(x, dim=dim, descending=largest, stable=True)
        want_values, want_indices = (t.narrow(dim, 0, k) for t in stable)
        eager_values = eager[0] if sorted_ else \
            torch.sort(eager[0], dim=dim, descending=largest, stable=True).values
        for values, indices in (path[i] for path in ours):
            what = f"topk(k={k}, dim={dim}, largest={largest}, sorted={sorted_}) of {x.dtype}"
            for got, want in ((values, eager_values), (values, want_values),
                              (x.gather(dim, indices), eager_values)):
                torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True,
                                           msg=lambda m, what=what: f"{what}: {m}")
            assert torch.equal(indices, want_indices), f"{what}: {indices} != {want_indices}"


def test_topk_of_equal_values_picks_the_lowest_indices():
    # RT-DETR v2 at random init: all 84 encoder scores of an image round to one float32
    # (-log 2), and topk(30) picked among them as the platform's unstable sort happened to
    # (XLA:CPU: 52, 62, 61, ...; eager's nth_element: 56, 83, 81, ...; torch.topk's docs
    # leave it unspecified). Ours is the stable sort's first k on every platform.
    scores = torch.full((3, 84), -0.6931472)
    with config.patch(strict=True, matmul_precision="highest"):
        values, indices = compile_tpu(lambda s: torch.topk(s, 30, dim=1))(scores)
    assert torch.equal(indices, torch.arange(30).expand(3, 30))
    assert torch.equal(values, torch.topk(scores, 30, dim=1).values)
    check_topk(scores, cases=[(30, True, True), (30, False, True)], on_device=True)


def topk_sweep_inputs():
    """Ties in long runs (also as a strided 3-d view), NaN, infinities and signed zeros, and
    distinct values (where eager's indices are the answer too)."""
    gen = torch.Generator().manual_seed(0)
    few_values = torch.randint(0, 3, (5, 40), generator=gen).float()   # long runs of ties
    special = torch.tensor([[NAN, 1, INF, -INF, 0.0, -0.0, 1, NAN, -INF, 2, INF, 0.0],
                            [-0.0, 0.0, -0.0, 0.0, NAN, NAN, NAN, 3, 3, -1, -1, -1]])
    distinct = torch.randn(4, 70, generator=gen)
    return few_values, few_values.reshape(5, 4, 10).transpose(0, 1), special, distinct


def test_topk_sweep_against_eager_with_ties_nan_infinities_and_signed_zeros():
    # Every case on the 2-d inputs; the strided 3-d view in tests/slow/test_decompositions_full.py
    few_values, _, special, distinct = topk_sweep_inputs()
    check_topk(few_values, special, distinct)
    check_topk(special, cases=TOPK_CASES[1:3] + TOPK_CASES[4:6], on_device=True)


def test_topk_of_every_dtype_with_ties():
    gen = torch.Generator().manual_seed(1)
    ties = torch.randint(0, 3, (3, 20), generator=gen)
    check_topk(*(ties.to(dtype) for dtype in (torch.float64, torch.bfloat16, torch.float16,
                                              torch.int64, torch.int32, torch.uint8)),
               cases=[(1, True, True), (0.5, True, True), (0.5, False, True)])


def test_topk_of_a_scalar_and_of_nothing_and_its_errors():
    check(lambda x: (torch.topk(x, 1), torch.topk(x, 0)), torch.tensor(2.5))
    check(lambda x: torch.topk(x, 0, dim=1), torch.zeros(3, 0))
    for bad, message in ((lambda x: torch.topk(x > 0, 1), "bool"),
                         (lambda x: torch.topk(x, 5), "k")):
        with pytest.raises(RuntimeError, match=message):
            bad(torch.zeros(4))
        with config.patch(strict=True), pytest.raises(RuntimeError, match=message):
            compile_tpu(bad)(torch.zeros(4))
        with pytest.raises(RuntimeError, match=message):
            bad(torch.zeros(4, device="tpu"))


# --- order statistics ------------------------------------------------------------------------

def test_kthvalue_counts_nan_as_largest():
    check(lambda x: torch.kthvalue(x, 2, 1), randn(5, 6))
    check(lambda x: torch.kthvalue(x, 3, 0, True), torch.tensor([[1.0, NAN], [3, 0], [2, 5]]))


def test_median_and_nanmedian_pick_the_lower_middle_as_eager():
    # Eager's rules: median is NaN (at the first NaN) if a NaN is present; nanmedian skips them.
    def medians(x):
        return (torch.median(x, 1), torch.nanmedian(x, 1), torch.median(x, 0, keepdim=True),
                torch.median(x), torch.nanmedian(x), torch.nanmedian(x[:3]))
    check_on_both_paths(medians, TIES_AND_NANS)
    check(lambda x: (torch.median(x, 0), torch.median(x)), torch.tensor([[5, 5, 5], [5, 1, 5]]))


def test_mode_is_the_smallest_most_frequent_value_at_its_last_position():
    check_on_both_paths(lambda x: (torch.mode(x), torch.mode(x, 0, keepdim=True)),
                        TIES_AND_NANS[[0, 2]])
    check(lambda x: torch.mode(x), torch.tensor([[1, 2, 2, 1, 3, 3, 0, 0, 0], [7] * 9]))


# --- binary search ---------------------------------------------------------------------------

def test_searchsorted_left_right_and_isin():
    s = torch.sort(randn(4, 7)).values
    check(lambda s, v: torch.searchsorted(s, v), s, randn(4, 3, seed=1))
    check(lambda s, v: torch.searchsorted(s, v, right=True, out_int32=True), s[0],
          torch.cat([s[0, :3], randn(3, seed=2)]))
    check(torch.isin, torch.randint(0, 9, (10,)), torch.tensor([1, 3, 5]))
    empty = torch.tensor([])
    check(lambda s, v, i: torch.searchsorted(s, v, sorter=i), empty, empty,
          torch.tensor([], dtype=torch.int64))


def _searches(s, v, s2d, v2d):
    return (torch.searchsorted(s, v), torch.searchsorted(s, v, side="right"),
            torch.bucketize(v, s), torch.bucketize(v, s, right=True, out_int32=True),
            torch.searchsorted(s2d, v2d), torch.bucketize(v, s[:0]))


def test_searchsorted_and_bucketize_search_as_the_cpu_kernel_with_nan():
    # The CPU kernel's binary search goes right at a NaN, of the values (a NaN value lands at
    # the end) or of the sequence (torch.sort puts NaN last). Counting put a NaN value at 0;
    # bucketize, lowered whole, put everything at the end past a NaN boundary; compiled at
    # exact shapes (dynamic=True), the graph was not decomposed at all. (The static compile
    # path decomposes as the device does.)
    s = torch.tensor([1.0, 2.0, 2.0, NAN, NAN])
    v = torch.tensor([NAN, 0.0, 2.0, 2.5, INF, -INF])
    s2d, v2d = torch.tensor([[1.0, NAN], [0.0, 3.0]]), torch.tensor([[NAN, 0.5], [3.0, 4.0]])
    with config.patch(strict=True):
        actual = compile_tpu(_searches, dynamic=True)(s, v, s2d, v2d)
    torch.testing.assert_close(actual, _searches(s, v, s2d, v2d), rtol=0, atol=0)
    # on the device, strict: a 0-d value too (its index was read as a Python int)
    check_on_both_paths(lambda s, v: (torch.searchsorted(s, v), torch.bucketize(v[0], s)), s, v)
