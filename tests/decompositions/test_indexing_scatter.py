"""The indexing and scatter decompositions
(torchtpu_compile/lower/decompositions/indexing_scatter.py) against eager CPU PyTorch, in strict
mode: the op must run through XLA, not fall back, and give eager's numbers (negative indices,
masks, repeated targets)."""
from __future__ import annotations

import pytest
import torch

from tests.support.decomposition_checks import NAN, check, check_on_both_paths, randn
from torchtpu_compile import config

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


# --- indexing --------------------------------------------------------------------------------

def test_take_wraps_negative_indices():
    check(torch.take, randn(3, 4), torch.tensor([[0, -1], [5, -12]]))


def test_take_of_any_rank_with_negative_indices():
    x = randn(3, 4)
    check(lambda x, i: torch.take(x, i), x, torch.tensor([[0, -1], [5, -12]]))
    check(lambda x, i: torch.take(x, i), torch.tensor(2.5), torch.tensor(0))
    with config.patch(strict=True):  # the eager device: a 0-dim index no longer falls back
        out = torch.take(torch.tensor(2.5, device="tpu"), torch.tensor(-1, device="tpu"))
    assert out.cpu().item() == 2.5


def test_put_with_and_without_accumulate():
    # Without accumulate, distinct targets (which duplicate wins is unspecified); with it, -12
    # and 0 are the same element and add up.
    x, values = randn(3, 4), randn(2, 2, seed=1)
    check(lambda x, i, v: x.put(i, v), x, torch.tensor([[0, -1], [5, -11]]), values)
    check(lambda x, i, v: x.put(i, v, accumulate=True), x, torch.tensor([[0, -1], [5, -12]]),
          values)


def test_advanced_indexing_with_negative_indices():
    # torch-mlir read the wrong elements for these (Falcon's fused QKV split), silently.
    x = randn(2, 8, 6, 4)
    check(lambda x: x[..., [-2], :] * 1, x)
    check(lambda x, i: x[:, i] * 1, x, torch.tensor([-1, 0, -3]))
    check(lambda x, i, j: x[i, :, j] * 1, x, torch.tensor([[-1], [0]]), torch.tensor([-6, 5]))


def test_index_put_rows_negative_and_accumulated():
    x = randn(5, 5)
    check(lambda x, i, v: torch.index_put(x, [i], v), x, torch.tensor([3]), randn(1, 5))
    check(lambda x, i, v: torch.index_put(x, [i], v), x, torch.tensor([4, 0, -1, 2, 1]), randn(5))
    check(lambda x, i, j, v: torch.index_put(x, [i, j], v, accumulate=True), x,
          torch.tensor([4, 0, 4]), torch.tensor([1, 1, 1]), randn(3))


def test_index_put_with_gaps_and_negative_indices():
    def update(x, v):
        y = x.clone()
        y[:, [-2]] = v  # index_put with a None gap, then the negative index
        return y
    check(update, randn(4, 5), randn(4, 1))

    def grad_of_negative_index(x):  # backward: index_put(accumulate=True) with a gap
        return torch.autograd.grad((x[..., [-2], :] * 2).sum(), x)[0]
    check(grad_of_negative_index, randn(2, 3, 4, 5).requires_grad_())


def test_index_put_with_a_boolean_mask_and_a_broadcast_value():
    mask = torch.tensor([True, True, False, True, False])
    check(lambda x, v: torch.index_put(x, (mask,), v), randn(5, 5), randn(5, seed=1))
    check(lambda x, v: torch.index_put(x, (mask,), v, accumulate=True), randn(5, 5),
          torch.tensor(2.0))


# --- scatter reductions ----------------------------------------------------------------------

REDUCTIONS = ("sum", "mean", "prod", "amax", "amin")


def test_scatter_reduce_every_reduction():
    # No lowering; every reduction, with and without self, a source larger than the index,
    # repeated targets and targets never hit; an integer case for the floor-dividing mean.
    # One graph per dtype: each compile costs seconds.
    x, src = randn(4, 5), randn(3, 6, seed=1)
    index = torch.tensor([[0, 1, 3, 0, 1], [0, 0, 3, 2, 1], [2, 0, 0, 0, 1]])
    check(lambda x, i, s: [x.scatter_reduce(dim, i.clamp(max=4), s, r, include_self=inc)
                           for r in REDUCTIONS for dim in (0, 1) for inc in (True, False)],
          x, index, src)
    ints = torch.arange(20).reshape(4, 5) - 7
    check(lambda x, i, s: [x.scatter_reduce(0, i, s, r) for r in REDUCTIONS], ints, index,
          (src * 10).long())
    with config.patch(strict=True):  # the eager device: no fallback either
        out = x.to("tpu").scatter_reduce(0, index.to("tpu"), src.to("tpu"), "amax").cpu()
    torch.testing.assert_close(out, x.scatter_reduce(0, index, src, "amax"))


def test_scatter_with_add_and_multiply():
    x, src = randn(4, 5), randn(3, 6, seed=1)
    index = torch.tensor([[0, 1, 3, 0, 1], [0, 0, 3, 2, 1], [2, 0, 0, 0, 1]])
    check(lambda x, i, s: [x.scatter(0, i, s, reduce=r) for r in ("add", "multiply")] +
          [x.scatter(1, i, 1.5, reduce=r) for r in ("add", "multiply")], x, index, src)


def test_index_reduce_every_reduction():
    x, src = randn(4, 5), randn(4, 3, seed=1)
    index = torch.tensor([4, 0, 4])
    check(lambda x, i, s: [x.index_reduce(1, i, s, r, include_self=inc)
                           for r in ("prod", "mean", "amax", "amin") for inc in (True, False)],
          x, index, src)
    scalar = torch.tensor(2.0)  # 0-dim self, index and source
    check(lambda x, s: [x.index_reduce(0, torch.tensor([0]), s, r) for r in ("prod", "amax")] +
          [x.scatter_reduce(0, torch.tensor(0), s, "sum")], scalar, torch.tensor(3.0))


def test_segment_reduce_with_empty_segments_initial_and_offsets():
    data, lengths = torch.tensor([1.0, 2, 3, NAN, 5, 6, 7]), torch.tensor([2, 0, 3, 2])
    rows, offsets = torch.arange(12.0).reshape(2, 6), torch.tensor([[0, 2, 6], [0, 3, 6]])

    def segments(data, lengths, rows, offsets):
        out = []
        for reduce in ("sum", "mean", "max", "min", "prod"):
            out.append(torch.segment_reduce(data, reduce, lengths=lengths))
            out.append(torch.segment_reduce(data, reduce, lengths=lengths, initial=10.0))
            out.append(torch.segment_reduce(rows, reduce, offsets=offsets, axis=1))
        return out
    check(segments, data, lengths, rows, offsets)


def test_half_width_scatter_sums_accumulate_in_float32():
    # The CPU kernels sum bf16 and f16 in float32; the scatters in bf16 stalled: a thousand
    # values near 1 into one slot summed to 512, and their mean was 0.5 (eager: 1.0).
    generator = torch.Generator().manual_seed(0)
    src = torch.rand(3000, generator=generator) + 0.5
    index = torch.randint(0, 3, (3000,), generator=generator)
    start = torch.rand(3, generator=generator)

    def scatters(start, index, src):
        b, s = start.bfloat16(), src.bfloat16()
        return (b.scatter_add(0, index, s), b.scatter_reduce(0, index, s, "sum"),
                b.scatter_reduce(0, index, s, "mean"),
                b.scatter_reduce(0, index, s, "mean", include_self=False),
                start.half().scatter_add(0, index, src.half()))
    check_on_both_paths(scatters, start, index, src, rtol=4e-3, atol=0)
