"""Bounded dynamism: padded buckets give eager's results at every real size, with few compiles.

The full 40-length runs over 1..512 live in tests/slow/test_buckets_full.py.
"""
from __future__ import annotations

import copy
import math
import random

import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F

import torchtpu_compile
from torchtpu_compile.buckets import bucket_size, choose

from tests.support.dynamic_models import Decoder
from tests.support.helpers import compile_tpu
from torchtpu_compile import config

SIZES = (3, 6, 13)  # buckets 8, 8, 16: two compiles and one bucket hit


def _graphs(kind=None):
    graphs = torchtpu_compile.stats()["graphs"]
    return {name: g for name, g in graphs.items() if kind is None or name.endswith(kind)}


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5, equal_nan=True)


# --- policy ------------------------------------------------------------------------------------

def test_default_policy_is_powers_of_two_then_multiples_of_128():
    with config.patch(bucket_policy="pow2-128", bucket_min=8):
        assert [bucket_size(s) for s in (2, 8, 9, 100, 128, 129, 300, 512, 513)] == \
            [8, 8, 16, 128, 128, 256, 384, 512, 640]


def test_other_policies():
    assert bucket_size(65, "multiple-64") == 128
    assert bucket_size(70, "16,64,256") == 256
    assert bucket_size(300, "16,64,256") == 448  # past the ladder: its last step again
    assert bucket_size(5, lambda n: n + 1) == 6
    with pytest.raises(ValueError, match="bucket_policy"):
        bucket_size(5, "fibonacci")
    with pytest.raises(ValueError, match="at least the size"):
        bucket_size(5, lambda n: n - 1)


def test_max_buckets_reuses_covering_bucket_then_grows():
    with config.patch(bucket_policy="pow2-128", bucket_min=8, max_buckets=3):
        assert choose((5,), []) == ((8,), True)
        assert choose((20,), [(8,), (32,)]) == ((32,), False)            # canonical exists
        assert choose((100,), [(8,), (32,)]) == ((128,), True)            # under the cap
        assert choose((20,), [(8,), (64,), (128,)]) == ((64,), False)     # smallest covering
        assert choose((300,), [(8,), (64,), (128,)]) == ((384,), True)    # past the largest
        # two dynamic dims: the last slot covers everything seen so far
        assert choose((3, 20), [(8, 8), (16, 16)]) == ((16, 32), True)


def test_a_negative_int_argument_is_its_own_bucket_and_huge_sizes_round_exactly():
    with config.patch(bucket_policy="pow2-128", bucket_min=8, max_buckets=3):
        assert choose((-2, 5), []) == ((-2, 8), True)
        assert choose((-3, 5), [(-2, 8), (0, 8)]) == ((-3, 8), True)   # -2 does not cover -3
        assert choose((-3, 5), [(-2, 8), (0, 8), (-3, 16)]) == ((-3, 16), False)
        assert choose((4, 20), [(-2, 8), (0, 8), (8, 8)]) == ((8, 32), True)
    # a float's 53 bits rounded 2**53 + 1 down to a "bucket" below it (a ValueError)
    assert bucket_size(2 ** 53 + 1, "pow2-128") == 2 ** 53 + 128


@pytest.mark.parametrize("fn, values", [
    (lambda x, s: (x * 1)[s], (2, -2, -1)),
    (lambda x, s: (x * 1).select(1, s), (1, -2)),
    (lambda x, s: (x * 1)[:, s:s + 2], (1, -3)),
    (lambda x, s: x + s, (5, 2 ** 53 + 1, -2 ** 62 - 3)),
], ids=["getitem", "select", "slice", "huge"])
def test_a_dynamic_int_argument_at_any_sign_matches_eager(fn, values, fresh_dynamo):
    # A negative index s passed as a Python int was bucketed like a size (to 8), so the
    # program took x[-2] of an intermediate as x[0]; 2**53 + 1 raised in the bucket policy.
    compiled = torch.compile(fn, backend="torchtpu", dynamic=True)
    x = torch.arange(12).reshape(3, 4)
    for s in values:
        assert torch.equal(compiled(x, s), fn(x, s)), s


@pytest.mark.parametrize("fn", [
    lambda x, k: [p.sum() for p in x.split([k, 10 - k])],
    lambda x, k: [p * 2 for p in (x * 1).split([2, k, 8 - k])],
    lambda x, k: torch.stack(x.split([k, 10 - k])[:1]),
    lambda x, k: [p.cumsum(0) for p in x.split(k)],
], ids=["two_parts", "three_parts", "stacked", "split_size"])
def test_a_static_dim_split_by_dynamic_sizes_matches_eager(fn, fresh_dynamo):
    # Default compile makes k dynamic from its second value: the split was taken at k's
    # bucket, so every part after the first began at the wrong element (sums 28 and 17 for
    # any k), and a part's length was the bucket's.
    compiled = torch.compile(fn, backend="torchtpu")
    x = torch.arange(10.0)
    for k in (2, 3, 5, 7):
        got, want = compiled(x, k), fn(x, k)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and torch.equal(g, w), k


def _batch_norm_grad(x):
    x = x.clone().requires_grad_()
    out = F.batch_norm(x, None, None, training=True, eps=1e-3)
    return torch.autograd.grad(out, x, torch.linspace(-1, 2, out.numel(), dtype=x.dtype)
                               .view(out.shape))[0]


@pytest.mark.parametrize("fn", [
    _batch_norm_grad,
    lambda x: F.interpolate(x, size=(1, 3), mode="bicubic"),
], ids=["batch_norm_backward", "bicubic_to_a_size"])
def test_float64_results_built_on_a_ratio_of_sizes_keep_float64_precision(fn, fresh_dynamo):
    # A bucket's program computed a ratio of sizes (a batch norm backward's 1/N, a resize's
    # scale) from int64 tensors, which divide in float32: float64 results were off by 1e-7
    # (fuzz seeds 8192 and 8216).
    compiled = torch.compile(fn, backend="torchtpu", dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(2, 3, n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
        torch.testing.assert_close(compiled(x), fn(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("other", [torch.zeros(0), torch.zeros(0, dtype=torch.float64)],
                         ids=["float32", "float64"])
def test_cat_with_an_empty_part_of_another_dtype_promotes_as_eager(other, fresh_dynamo):
    # cat skips a 1-d empty part, but eager still promotes to its dtype: the rule dropped it
    # first, and cat(int64, empty float32) came back int64.
    compiled = torch.compile(lambda a, b: torch.cat([a, b]), backend="torchtpu", dynamic=True)
    for n in (3, 5):
        a = torch.arange(2 * n).reshape(2, n)
        got, want = compiled(a, other), torch.cat([a, other])
        assert got.dtype == want.dtype and torch.equal(got, want)


# --- one rule at a time, against eager ---------------------------------------------------------

def _row_sort(x):
    values, indices = torch.sort(x, dim=1)
    return values, indices


def _last_rows(x):
    return torch.arange(x.shape[0]) * x.shape[1] + x.shape[1] - 1 - torch.arange(x.shape[0])


def _windows(x):
    padded = F.pad(x, (0, 0, 0, (4 - x.shape[1] % 4) % 4))
    windows = padded.view(3, padded.shape[1] // 4, 4, 5)
    mixed = windows.softmax(2) * windows.sum(2, keepdim=True)
    return mixed.view(3, -1, 5)[:, : x.shape[1]].cumsum(1)


def _shift_right(x):
    # T5's and BART's shift_tokens_right: a slice assignment, functionalized to a copy
    shifted = x.new_zeros(x.shape)
    shifted[:, 1:] = x[:, :-1].clone()
    shifted[:, 0] = 7.0
    return shifted


def _into_columns(rows):
    # a slice assignment into a buffer whose rows are a prefix of their count
    buffer = torch.arange(rows.shape[0], dtype=torch.float32)[:, None].repeat(1, 6)
    buffer[:, 1:] = rows
    return buffer


def _put(buffer, index, values):
    buffer[:, index] = values
    return buffer


CASES = {
    "sum_mean": lambda x: (x.sum(1), x.mean(1), x.mean(), x.sum()),
    "var_std": lambda x: (x.var(1), x.std(1, correction=0), torch.var_mean(x, 1)[0]),
    # a position in the flattened tensor (argmax()) counts real elements only, the padding
    # of dim 1 lying between them: it was the position in the padded tensor
    "max_argmax": lambda x: (x.amax(1), x.argmax(1), x.min(1).values, x.logsumexp(1),
                             x.argmax(), x.argmin(keepdim=True)),
    "softmax": lambda x: (torch.softmax(x, 1), torch.log_softmax(x, 1)),
    "layer_norm_over_dynamic_dim": lambda x: F.layer_norm(x.transpose(1, 2), (x.shape[1],)),
    "cumsum": lambda x: (x.cumsum(1), x.reshape(-1).cumsum(0)),
    # NaN sorts after +inf: padding must not come before it (ascending, or smallest first)
    "sort_topk": lambda x: (*_row_sort(x), x.topk(2, dim=1).values,
                            *_row_sort(torch.where(x > 1, math.nan, x)),
                            torch.where(x > 0, math.nan, x).topk(2, dim=1, largest=False).values),
    "arange_and_size_as_value": lambda x: (x + torch.arange(x.shape[1])[None, :, None],
                                           x / x.shape[1], x * (x.shape[1] - 1)),
    # a size in an op whose default overload takes Scalars (positions clamped to the length)
    "clamp_by_size": lambda x: (x.clamp(max=x.shape[1] - 4), x.clamp(-x.shape[1], 1.0),
                                x.clamp_min(x.shape[1] * 0.1), x.clamp_max(x.shape[1] / 9)),
    # (views of the input itself are returned by exact-shape programs: see
    # test_an_output_that_views_an_input_keeps_eager_values_and_strides)
    "index_from_real_end": lambda x: (x[:, -1] * 2, x[:, -2:] * 2, x[:, 1:] - x[:, :-1]),
    "contraction_over_dynamic_dim": lambda x: x.transpose(1, 2) @ x,
    "merged_dims": lambda x: (x.reshape(-1, 5).sum(0), x.reshape(-1).amax()),
    "attention": lambda x: F.scaled_dot_product_attention(x[None], x[None], x[None])[0],
    # a KV cache append: the padding of the first part lands between real elements
    "cat_with_padding_in_the_middle": lambda x: (
        torch.cat([x, x[:, :1] * 2], 1), torch.cat([x[:, :2], x, x], 1).softmax(1),
        torch.cat([x, x[:, -1:]], 1).cumsum(1)),
    # a static cache's prefill: padded entries of the written block must write nowhere (a
    # bucket of 16 reaches real positions of the 16 slots, and padding would race position 0)
    "index_put_of_padded_values": lambda x: (
        torch.zeros(3, 16, 5).index_copy(1, torch.arange(x.shape[1]), x),
        _put(torch.zeros(3, 16, 5), -1 - torch.arange(x.shape[1]), x * 2)),
    # negative indices along the padded dim count from the real end, as eager's (not from the
    # bucket's, into the padding): reads, writes, and writes that add
    "negative_index_along_padded_dim": lambda x: (
        x[:, torch.tensor([-1, -3])],
        _put(x.clone(), torch.tensor([-1, -3]), torch.ones(3, 2, 5)),
        torch.ops.aten.index_put(x, [None, torch.tensor([-2, -2])], torch.ones(3, 2, 5),
                                 True)),
    # attending over the first n slots of a static cache; a bucket of 16 reaches past its 14
    "slice_of_static_dim_by_dynamic_size": lambda x: (
        torch.arange(70.0).reshape(14, 5)[: x.shape[1]] + x[0],
        torch.arange(70.0).reshape(14, 5)[: x.shape[1]].softmax(0)),
    # Bloom's alibi and masks: a padded dim tiled (blocks padded at their ends), a static dim
    # tiled a dynamic number of times, a reduction over the tiled padded dim
    "repeat": lambda x: (x.repeat(2, 3, 1), x.repeat(1, 2, 1).softmax(1),
                         x[0, 0].repeat(x.shape[1], 1), x[:, 0].repeat(1, x.shape[1]).cumsum(1)),
    # a roll past the size along the padded dim: slices of lengths ``7 % n`` and ``n - 7 % n``
    # have no bound at the bucket's size, and real elements were dropped (zeros, no error)
    "roll_past_the_size": lambda x: (x.roll(7, 1), x.roll((-1, -9), (0, 1))),
    # get_attr nodes: tensors the graph holds (a cache's empty start)
    "constants": lambda x: (x * torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]),
                            torch.cat([torch.tensor([]), x.sum(2).reshape(-1)])),
    # a causal LM loss's shifted labels (``pad(labels, (0, 1), value=-100)[..., 1:]``): the
    # values after the real end go where the bucket had padding; before the start, a shift
    "constant_pad_of_padded_dim": lambda x: (
        F.pad(x, (0, 0, 0, 1), value=-100.0)[:, 1:], F.pad(x, (1, 0, 2, 3), value=0.5).cumsum(1),
        F.pad(x, (0, 0, 3, 0)).softmax(1)),
    "copy_into_a_slice": lambda x: (_shift_right(x), _shift_right(x).cumsum(1)),
    # a slice as long as the dim, from before its start (a sliding-window cache's
    # ``states[:, :, -4095:]`` of fewer states): its backward scatters into all of it
    "slice_scatter_of_the_whole_dim": lambda x: (
        torch.slice_scatter(torch.zeros_like(x), x[:, -20:].cos(), 1, -20),),
    # every part of a cat is a 1-d empty tensor (fuzz seed 1078: the rule indexed its first
    # kept part and raised IndexError)
    "cat_of_only_empty_parts": lambda x: (x * 2, torch.cat([x[0, 0, 5:], x[1, 0, 5:]])),
    # a squeeze with no dim of size 1 is prims.view_of (BERT's regression head squeezes its
    # logits before the MSE loss)
    # rows of ``x.reshape(3 * n, 5)`` picked by their real positions ``i * n + j``: in the
    # bucket, row (i, j) lies at ``i * N + j``; a whole-dim slice of such a dim (``flat[:, 0]``)
    "positions_along_merged_dims": lambda x: (
        x.reshape(-1, 5).index_select(0, _last_rows(x)),
        x.reshape(-1, 5).gather(0, _last_rows(x)[:, None].expand(3, 5)),
        torch.zeros(x.shape[0] * x.shape[1], 5).scatter_add(
            0, _last_rows(x)[:, None].expand(3, 5), x[:, 0]).cumsum(0),
        x.reshape(-1, 5)[:, 1:].sum(0)),
    # pads by sizes known at run time and cuts: a window partition's pad to a multiple of 7,
    # TensorFlow-style "same" padding (a share of the total before the start), a crop
    "pad_by_dynamic_amounts": lambda x: (
        F.pad(x, (0, 0, 0, (7 - x.shape[1] % 7) % 7), value=1.0).softmax(1),
        F.pad(x, (0, 0, x.shape[1] // 3, 1), value=2.0).softmax(1),
        F.pad(x, (0, 0, -1, 0)).softmax(1)),
    "squeeze_of_no_unit_dim": lambda x: (x.squeeze() * 2, x.sum(2).squeeze().cumsum(1)),
    # a view that moves real elements: a padded dim split (an interpolation's indices,
    # ``cat([a, b]).view(2, n)``), padded dims regrouped; each was "a view splits a padded dim"
    "view_that_moves_real_elements": lambda x: (
        torch.cat([x, x * 2], 1).view(3, 2, x.shape[1], 5).softmax(2),
        x.transpose(0, 1).reshape(x.shape[1], 15).reshape(-1, 3).cumsum(0)),
    # rows of merged padded dims after others (ViT's class token before its patches), and
    # next to a prefix of their product (BEiT's relative position index)
    "merged_dims_as_a_prefix": lambda x: (
        torch.cat([x[0, :1] * 3, x.reshape(-1, 5)], 0).softmax(0),
        x.reshape(-1, 5) + torch.arange(x.shape[0] * x.shape[1])[:, None],
        _into_columns(x.reshape(-1, 5))),
    # every k-th element to the end (Swin's patch merging, ``x[:, 1::2]``)
    "strided_slice_to_the_end": lambda x: (
        x[:, ::2] * 2, torch.cat([x, x * 2], 1)[:, 1::2].cumsum(1),
        torch.cat([x, x, x], 1)[:, 2::3].softmax(1)),
    # scans read only earlier positions; a running maximum's index counts them
    "scans": lambda x: (x.logcumsumexp(1), x.cummax(1), x.cummin(1).values * 2,
                        x.reshape(-1, 5).logcumsumexp(0)),
    # reversed along the padded dim, the real elements stay a prefix (cumsum's backward)
    "flip": lambda x: (x.flip(1) * torch.arange(x.shape[1])[None, :, None],
                       x.flip(1, 2).cumsum(1), torch.flip(x, [0, 1]).softmax(1)),
    # the padded diagonal holds the real one first (at an offset too), and its scatter (the
    # backward) writes past the real length only into padding
    "diagonal": lambda x: (x[:, :, :3].diagonal(0, 1, 2) * 2,
                           x.transpose(0, 1)[:, None].expand(-1, x.shape[1], -1, -1)
                           .diagonal(-1, 0, 1).cumsum(-1),
                           torch.diagonal_scatter(x[0][:, None].expand(-1, x.shape[1], -1)
                                                  .clone(), x[1, 1:].t(), 1, 0, 1).sum(1)),
    # wrapped around at the real size, by a fixed shift or by one of the size (through
    # torch's decomposition: slices and a cat)
    "roll": lambda x: (x.roll(2, 1) * 2, x.roll((-3, 1), (1, 2)).cumsum(1),
                       x.roll(x.shape[1] // 2, 1).softmax(1), torch.roll(x, 1, 0)),
    # ConvNeXt V2's global response normalization: zeros add nothing to a norm of order >= 0
    "vector_norm": lambda x: (
        torch.linalg.vector_norm(x, dim=1), torch.linalg.vector_norm(x, 1, dim=(1, 2)),
        torch.linalg.vector_norm(x, math.inf, dim=1), torch.linalg.vector_norm(x, 0, dim=1)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_matches_eager_at_every_size(name, fresh_dynamo):
    fn = CASES[name]
    compiled = compile_tpu(fn)
    with config.patch(matmul_precision="highest"):
        for i, n in enumerate(SIZES):
            x = torch.randn(3, n, 5)
            if i == 0:
                torch._dynamo.mark_dynamic(x, 1)
            _close(compiled(x), fn(x))
    stats = torchtpu_compile.stats()
    assert stats["buckets"]["exact_shape_compiles"] == 0
    assert stats["buckets"]["compiles"] == 2 and stats["buckets"]["hits"] == 1
    # what a rule emits lowers: nothing of the bucket's program runs in eager PyTorch
    assert stats["fallback_ops"] == {}


def test_a_cumulative_sum_trains_along_the_dynamic_dim_per_bucket(fresh_dynamo):
    # cumsum's backward flips the gradient along the summed dim: it compiled per shape
    fn = lambda x: (x.cumsum(1) * x).square().mean()  # noqa: E731
    compiled = compile_tpu(fn)
    for i, n in enumerate(SIZES):
        x = torch.randn(3, n, 5)
        if i == 0:
            torch._dynamo.mark_dynamic(x, 1)
        mine, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        actual, expected = compiled(mine), fn(theirs)
        _close(actual, expected)
        actual.backward()
        expected.backward()
        _close(mine.grad, theirs.grad)
    stats = torchtpu_compile.stats()
    assert stats["buckets"]["exact_shape_compiles"] == 0 and stats["fallback_ops"] == {}


def test_a_window_partition_matches_eager_per_bucket(fresh_dynamo):
    # Swin's window partition and its reverse: the length padded to a multiple of 4 by a
    # size's remainder, viewed as (windows, 4) and back (Dynamo may guard on the remainder).
    compiled = compile_tpu(_windows)
    with config.patch(matmul_precision="highest"):
        for i, n in enumerate((3, 6, 13, 16, 9)):
            x = torch.randn(3, n, 5)
            if i == 0:
                torch._dynamo.mark_dynamic(x, 1)
            _close(compiled(x), _windows(x))
    stats = torchtpu_compile.stats()
    assert stats["buckets"]["exact_shape_compiles"] == 0 and stats["fallback_ops"] == {}


def test_pooling_the_last_real_token_trains_per_bucket(fresh_dynamo):
    # Hugging Face's GPT-2 and Llama sequence classifiers pool ``logits[arange(b), last]``:
    # its backward adds into ``view(b * s, c)`` at ``i * s + last[i]``, with the batch and
    # the length both padded. Each (b, s) compiled a program of its own.
    def pooled(logits, ids):
        last = (torch.arange(ids.shape[1]) * (ids != 0).int()).argmax(-1)
        return logits[torch.arange(ids.shape[0]), last].square().sum()
    compiled = compile_tpu(pooled)
    for i, (b, s) in enumerate(((2, 9), (3, 13), (4, 20), (2, 11), (5, 7))):
        ids = torch.randint(0, 5, (b, s))
        logits = torch.randn(b, s, 3, requires_grad=True)
        mine = logits.detach().clone().requires_grad_()
        if i == 0:
            for t in (mine, ids):
                torch._dynamo.mark_dynamic(t, 0)
                torch._dynamo.mark_dynamic(t, 1)
        loss = compiled(mine, ids)
        loss.backward()
        expected = pooled(logits, ids)
        expected.backward()
        _close(loss, expected)
        _close(mine.grad, logits.grad)
    stats = torchtpu_compile.stats()
    assert stats["buckets"]["exact_shape_compiles"] == 0 and stats["fallback_ops"] == {}


def test_a_padded_dim_times_a_static_one_is_one_layout_however_spelled(fresh_dynamo):
    # ``(s, 3)`` (a view of (s, 3, 4) as (3 * s, 4)) holds the first 3 * s rows, as a tensor
    # of size 3 * s does: BERT's multiple-choice head meets both in its backward. The two
    # were refused as "padded differently", and a view of 3 * s into (s, 3) as a split.
    def fn(x, y):
        return (x.reshape(-1, 4) + y).cumsum(0), (y.view(-1, 3, 4) * x).sum(1)
    compiled = compile_tpu(fn)
    for i, n in enumerate((5, 7, 13)):
        x, y = torch.randn(n, 3, 4), torch.randn(3 * n, 4)
        if i == 0:
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(y, 0)
        for actual, expected in zip(compiled(x, y), fn(x, y)):
            _close(actual, expected)
    assert torchtpu_compile.stats()["buckets"]["exact_shape_compiles"] == 0


#: Images whose height and width vary: convolutions read their own zero padding past the real
#: end, where a bucket has its padding (each case has weights: its gradients are checked too).
IMAGE_CASES = {
    "conv_strided_padded": lambda: nn.Conv2d(3, 4, 7, stride=2, padding=3),
    "conv_dilated_depthwise": lambda: nn.Conv2d(3, 3, 3, padding=2, dilation=2, groups=3),
    "conv_transposed": lambda: nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1,
                                                  output_padding=1),
    # max pooling's windows pad with -inf; its indices count real positions of the plane
    "max_pool_with_indices": lambda: _Pooled(nn.MaxPool2d(3, 2, 1, return_indices=True)),
    "max_pool_ceil_mode": lambda: nn.Sequential(nn.Conv2d(3, 2, 1),
                                                nn.MaxPool2d(2, 2, ceil_mode=True)),
    "global_average_pool": lambda: nn.Sequential(nn.Conv2d(3, 2, 3, padding=1),
                                                 nn.AdaptiveAvgPool2d(1)),
    # windows of the real size, overlapping where it does not divide; wider than the image
    # (8 outputs over a width of 7) too. Torch's decompositions gather over the longest
    # window, ceil(w/4) - w//8 here: 3 at 14, 2 at the bucket's 16; the bucket dropped part of
    # each window, silently (max pooling 0.7 off at 11 x 14, average pooling's gradient).
    "adaptive_average_pool_to_a_grid": lambda: nn.Sequential(nn.Conv2d(3, 2, 1),
                                                             nn.AdaptiveAvgPool2d((3, 8))),
    "adaptive_max_pool_to_a_grid": lambda: nn.Sequential(nn.Conv2d(3, 2, 1),
                                                         nn.AdaptiveMaxPool2d((3, 8))),
    "adaptive_max_pool_indices": lambda: _Pooled(nn.AdaptiveMaxPool2d((3, 8),
                                                                      return_indices=True)),
    # each window divided by its area (PoolFormer: padding not counted, by the pad and
    # divisor it decomposes to)
    "average_pool": lambda: nn.Sequential(nn.Conv2d(3, 2, 1), nn.AvgPool2d(3, 2, 1),
                                          nn.AvgPool2d(2)),
    "average_pool_padding_not_counted": lambda: nn.Sequential(
        nn.Conv2d(3, 2, 1), nn.AvgPool2d(3, 1, 1, count_include_pad=False)),
    # ceil mode's last window is cut at the real end, and divided by what it covers (RT-DETR's
    # ResNet shortcut; timm's ResNet-D with its padding not counted)
    "average_pool_ceil_mode": lambda: nn.Sequential(nn.Conv2d(3, 2, 1),
                                                    nn.AvgPool2d(2, 2, 0, ceil_mode=True)),
    "average_pool_ceil_mode_padding_not_counted": lambda: nn.Sequential(
        nn.Conv2d(3, 2, 1), nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False)),
    "average_pool_3d_ceil_mode": lambda: _Volume(nn.AvgPool3d((1, 3, 2), 2, (0, 1, 0),
                                                               ceil_mode=True)),
}


class _Volume(nn.Module):
    """A pool over (depth 2, height, width) of the conv's output."""
    def __init__(self, pool):
        super().__init__()
        self.conv, self.pool = nn.Conv2d(3, 4, 1), pool

    def forward(self, x):
        y = self.conv(x)
        return self.pool(y.unflatten(1, (2, 2)))


class _Pooled(nn.Module):
    def __init__(self, pool):
        super().__init__()
        self.conv, self.pool = nn.Conv2d(3, 2, 1), pool

    def forward(self, x):
        values, indices = self.pool(self.conv(x))
        return values, indices


def _trains_as_eager_at_image_sizes(eager, sizes) -> None:
    """Compile a copy of ``eager`` (images dynamic in height and width from the first call)
    and train it at each (height, width) of ``sizes``: every output, the input's gradient and
    every parameter's gradient against eager's."""
    model = copy.deepcopy(eager)
    compiled = compile_tpu(model)
    with config.patch(matmul_precision="highest"):
        for i, (h, w) in enumerate(sizes):
            x = torch.randn(2, 3, h, w)
            if i == 0:
                torch._dynamo.mark_dynamic(x, 2)
                torch._dynamo.mark_dynamic(x, 3)
            mine, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
            actual, expected = compiled(mine), eager(theirs)
            for a, e in zip(_leaves(actual), _leaves(expected)):
                if a.is_floating_point():
                    _close(a, e)
                else:
                    assert torch.equal(a, e)
            _first(actual).square().sum().backward()
            _first(expected).square().sum().backward()
            _close(mine.grad, theirs.grad)
            for p, q in zip(model.parameters(), eager.parameters()):
                _close(p.grad, q.grad)
                p.grad = q.grad = None


@pytest.mark.parametrize("name", sorted(IMAGE_CASES))
def test_image_ops_over_padded_height_and_width_match_eager(name, fresh_dynamo):
    # They compiled once per image size ("a convolution over a padded channel or spatial dim").
    torch.manual_seed(0)
    _trains_as_eager_at_image_sizes(IMAGE_CASES[name](), ((9, 9), (11, 14), (13, 7), (16, 15)))
    stats = torchtpu_compile.stats()
    assert stats["buckets"]["exact_shape_compiles"] == 0 and stats["fallback_ops"] == {}
    assert stats["buckets"]["compiles"] == 4  # buckets 16 x 16, forward and backward


@pytest.mark.parametrize("pool", [nn.AdaptiveAvgPool2d((2, None)), nn.AdaptiveMaxPool2d((None, 3))])
def test_adaptive_pooling_to_an_output_as_long_as_its_input_matches_eager(pool, fresh_dynamo):
    # (2, None) keeps the dynamic width: the bucket's windows would change with it, so the
    # graph runs at its exact shapes (the pooling rule raised TypeError on the size; fuzz
    # seed 7299)
    torch.manual_seed(0)
    _trains_as_eager_at_image_sizes(nn.Sequential(nn.Conv2d(3, 2, 1), pool),
                                    ((9, 9), (11, 14), (13, 7)))


def _pools_each_channel(x, w):
    y = x * w
    return (F.adaptive_avg_pool2d(y, (3, 2)), F.adaptive_max_pool2d(y, (2, 3))[0],
            F.max_pool2d(y, 3, 2, 1), F.avg_pool2d(y, 2, ceil_mode=True))


@pytest.mark.parametrize("batched", [False, True])
def test_pooling_over_padded_channels_trains_per_bucket(batched, fresh_dynamo):
    # Pooling keeps each channel apart (a convolution contracts them): a dynamic channel dim,
    # and the height of an unbatched (C, H, W) input, compiled once per shape before (fuzz
    # seeds 7400-7599: "adaptive average pooling's gradient over a padded channel dim").
    torch.manual_seed(0)
    compiled = compile_tpu(_pools_each_channel, dynamic=True)
    w = torch.randn(1)
    with config.patch(matmul_precision="highest"):
        for shape in ((2, 9, 7), (2, 11, 14), (3, 13, 5), (4, 6, 15)):
            x = torch.randn((2, *shape) if batched else shape)
            mine = [t.clone().requires_grad_() for t in (x, w)]
            theirs = [t.clone().requires_grad_() for t in (x, w)]
            actual, expected = compiled(*mine), _pools_each_channel(*theirs)
            for a, e in zip(actual, expected):
                _close(a, e)
            sum(t.square().sum() for t in actual).backward()
            sum(t.square().sum() for t in expected).backward()
            for a, e in zip(mine, theirs):
                _close(a.grad, e.grad)
    assert torchtpu_compile.stats()["buckets"]["exact_shape_compiles"] == 0


def _contrastive_loss(a, b, scale):
    logits = (a @ b.T) * scale
    return -(logits.diag() - logits.logsumexp(1)).mean()


def test_a_contrastive_loss_over_a_dynamic_batch_trains_per_bucket(fresh_dynamo):
    # logits.diag() of two inputs' batches: its decomposition, a strided slice of the flattened
    # (batch, batch) dims, compiled once per shape, and its size Min(s0, s1) beside the batch
    # s1 combined dims padded differently
    compiled = compile_tpu(_contrastive_loss)
    scale = torch.tensor(2.0)
    with config.patch(matmul_precision="highest"):
        for i, n in enumerate((5, 7, 9, 12)):
            a, b = torch.randn(n, 8), torch.randn(n, 8)
            if i == 0:
                torch._dynamo.mark_dynamic(a, 0)
                torch._dynamo.mark_dynamic(b, 0)
            mine = [t.clone().requires_grad_() for t in (a, b, scale)]
            theirs = [t.clone().requires_grad_() for t in (a, b, scale)]
            actual, expected = compiled(*mine), _contrastive_loss(*theirs)
            _close(actual, expected)
            actual.backward()
            expected.backward()
            for m, t in zip(mine, theirs):
                _close(m.grad, t.grad)
    stats = torchtpu_compile.stats()["buckets"]
    assert stats["exact_shape_compiles"] == 0 and stats["compiles"] == 4


def _leaves(value):
    return value if isinstance(value, (tuple, list)) else (value,)


def _first(value):
    return _leaves(value)[0]


def test_a_stack_of_empty_tensors_next_to_a_padded_one_matches_eager(fresh_dynamo):
    # fuzz seed 1078: the cat rule indexed its first non-empty part and raised IndexError
    fn = lambda x, e: (x * 2, torch.stack([e, e]))  # noqa: E731
    compiled = compile_tpu(fn, dynamic=True)
    for n in (5, 6):
        args = torch.randn(n, 3), torch.ones(1, dtype=torch.float16)[1:]
        for actual, expected in zip(compiled(*args), fn(*args)):
            assert actual.dtype == expected.dtype and torch.equal(actual, expected)


def test_a_size_smaller_at_the_bucket_than_below_it_is_not_padded(fresh_dynamo):
    # ceil(n/4) - n//8 is 3 at 14 and 2 at 16 (adaptive pooling's longest window has this
    # form): a bucket of 16 holds fewer elements than 14 gives, and the cut-back of the
    # result raised "start (0) + length (3) exceeds dimension size (2)". Such a graph runs at
    # its exact shapes instead.
    def fn(x):
        k = (x.shape[0] + 3) // 4 - x.shape[0] // 8
        return torch.arange(k) * 2.0 + x[:k], x[:k].cumsum(0)

    compiled = compile_tpu(fn, dynamic=True)
    for n in (9, 14, 13, 15):
        x = torch.randn(n)
        for actual, expected in zip(compiled(x), fn(x)):
            torch.testing.assert_close(actual, expected)
    stats = torchtpu_compile.stats()["buckets"]
    assert stats["compiles"] == 0 and stats["exact_shape_compiles"] > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_width_variance_of_a_padded_dim_is_computed_in_float32(dtype, fresh_dynamo):
    # fuzz seed 6061: a float16 sum of squares past 65504 was inf; eager's kernel computes
    # half widths in float32 and rounds once
    fn = lambda x: (torch.var_mean(x, dim=(0, 1), correction=0),  # noqa: E731
                    x.var(1), x.std(dim=(0, 1)))
    compiled = compile_tpu(fn, dynamic=True)
    for n in (5, 6):
        x = torch.full((2, n), 200.0, dtype=dtype)
        x[:, ::2] = -200.0
        for actual, expected in zip(torch.utils._pytree.tree_leaves(compiled(x)),
                                    torch.utils._pytree.tree_leaves(fn(x))):
            assert actual.dtype == expected.dtype
            torch.testing.assert_close(actual, expected)


def test_a_variance_whose_float32_squares_overflow_is_finite_per_bucket(fresh_dynamo):
    # The unpadded decomposition divides by a power of two near the largest magnitude first;
    # the padding rule did not: var of 1e17-sized values was inf (eager 1e34)
    fn = lambda x: (x.var(), x.std(dim=1), x.var(0, keepdim=True))  # noqa: E731
    compiled = compile_tpu(fn, dynamic=True)
    for n in (5, 6):
        x = torch.randn(n, 40000, generator=torch.Generator().manual_seed(n)) * 1e17
        for actual, expected in zip(compiled(x), fn(x)):
            assert torch.isfinite(actual).all()
            torch.testing.assert_close(actual, expected, rtol=1e-5, atol=0)
    assert torchtpu_compile.stats()["buckets"]["exact_shape_compiles"] == 0


def test_a_slice_whose_length_is_a_remainder_of_the_size_matches_eager(fresh_dynamo):
    # ``n - 7 % n`` at a bucket of 8 is 1, at a real 5 it is 3: the padded slice was too short
    # and dropped real elements. Such a graph compiles per exact shape.
    fn = lambda x: x[:, : x.shape[1] - 7 % x.shape[1]] * 2  # noqa: E731
    compiled = compile_tpu(fn, dynamic=True)
    for n in (5, 6):
        x = torch.arange(2.0 * n).reshape(2, n)
        assert torch.equal(compiled(x), fn(x))


def test_a_size_dynamo_made_a_constant_next_to_a_padded_tensor_runs_exact(fresh_dynamo):
    # Dynamo gives ``linspace(..., x.numel())`` the real numel as a constant (under a guard)
    # while x stays symbolic: the bucket met x padded and raised a broadcast error; forward
    # and backward now compile for the exact shape.
    def step(x):
        return (x.reshape(-1).cumsum(0) * torch.linspace(0.5, 1.5, x.numel())).sum()

    compiled = compile_tpu(step, dynamic=True)
    for n in (5, 7):
        x = torch.randn(n, 4, requires_grad=True)
        mine = x.detach().clone().requires_grad_()
        expected = step(x)
        expected.backward()
        actual = compiled(mine)
        actual.backward()
        _close(actual, expected)
        _close(mine.grad, x.grad)


def test_a_float_computed_from_a_size_keeps_eager_dtype(fresh_dynamo):
    # Label smoothing scales the loss by ``0.1 / num_classes``: with the class count dynamic,
    # the bucket took the number as a float64 tensor and returned a float64 loss.
    def loss(x):
        return F.cross_entropy(x, torch.arange(x.shape[0]) % 4, label_smoothing=0.1)

    compiled = compile_tpu(loss, dynamic=True)
    for n in (5, 7):
        x = torch.randn(n, 4)
        actual, expected = compiled(x), loss(x)
        assert actual.dtype == expected.dtype
        _close(actual, expected)


def test_an_attention_scaled_by_its_head_dim_runs_per_bucket(fresh_dynamo):
    # Under dynamic=True the head dim is a symbol too, and SDPA's default scale,
    # ``1 / sqrt(head_dim)``, has no value on padded sizes: the graph compiled once per
    # length. The head dim is held at its value now, and the length picks buckets.
    def attend(q, k, v):
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(k.size(-1)))
        causal = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).tril()
        mixed = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        return mixed + F.scaled_dot_product_attention(q, k, v, is_causal=True)

    compiled = compile_tpu(attend, dynamic=True)
    with config.patch(matmul_precision="highest"):
        for n in (5, 9, 6):
            q, k, v = (torch.randn(2, 2, n, 8, requires_grad=True) for _ in range(3))
            with torch.no_grad():  # an inference graph keeps SDPA whole
                _close(compiled(q, k, v), attend(q, k, v))
            actual, expected = compiled(q, k, v), attend(q, k, v)
            _close(torch.autograd.grad(actual.square().sum(), (q, k, v)),
                   torch.autograd.grad(expected.square().sum(), (q, k, v)))
    stats = torchtpu_compile.stats()["buckets"]
    assert stats["exact_shape_compiles"] == 0 and stats["hits"] > 0


def test_grouped_query_attention_over_a_dynamic_length_runs_per_bucket(fresh_dynamo):
    # enable_gqa expands the kv heads by ``q_heads // kv_heads``, a size that smaller head
    # counts outgrow: the head counts are held, the length is bucketed
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    compiled = compile_tpu(attend, dynamic=True)
    with config.patch(matmul_precision="highest"):
        for n in (5, 9, 17, 6):
            q, k, v = torch.randn(2, 4, n, 8), torch.randn(2, 2, n, 8), torch.randn(2, 2, n, 8)
            _close(compiled(q, k, v), attend(q, k, v))
    stats = torchtpu_compile.stats()["buckets"]
    assert stats["exact_shape_compiles"] == 0 and stats["hits"] > 0


def test_a_held_size_that_keeps_changing_runs_exact(fresh_dynamo):
    # Held sizes get buckets per value up to config.max_buckets values; past them, the
    # graph compiles per exact shape, with eager's values throughout
    def fn(x):  # SDPA's default scale is 1 / sqrt of the head dim, here n + 1
        return F.scaled_dot_product_attention(x, x, x)

    compiled = compile_tpu(fn, dynamic=True)
    with config.patch(max_buckets=2, matmul_precision="highest"):
        for n in (3, 5, 6, 7, 9):
            x = torch.randn(1, n, n + 1)
            _close(compiled(x), fn(x))
    stats = torchtpu_compile.stats()["buckets"]
    assert stats["exact_shape_compiles"] > 0


def test_a_size_no_node_reads_picks_no_bucket(fresh_dynamo):
    # ``n`` reaches the graph as a size input that nothing reads (``m - n`` is folded to 1),
    # as a size does in Falcon's decode step: it made a bucket dimension of its own, so every
    # new ``n`` compiled the same program again (3 programs here instead of 2).
    def step(x, n):
        m = n + 1
        return x * 2 + (m - n)

    compiled = compile_tpu(step, dynamic=True)
    for length, n in zip(SIZES, (100, 300, 700)):
        x = torch.randn(length)
        _close(compiled(x, n), step(x, n))
    [graph] = _graphs("/inference").values()
    assert graph["buckets"] == [[8], [16]], graph


def test_a_slice_from_a_dynamic_count_before_the_end_keeps_the_last_rows(fresh_dynamo):
    # x[:, -k:] with k dynamic too (Hugging Face's ``logits_to_keep``, which assisted decoding
    # passes): the padded rule took -k as a position from the front, clamped to 0, and returned
    # the first k rows, so the compiled model verified the assistant's tokens against the wrong
    # logits. Sizes (8, 9, 12) with k (2, 2, 3): buckets 8 and 16, both sides of a bucket.
    fn = lambda x, k: (x * 2)[:, -k:, :]  # noqa: E731
    compiled = compile_tpu(fn)
    for n, k in ((7, 1), (8, 2), (9, 2), (12, 3)):
        x = torch.randn(1, n, 4)
        assert torch.equal(compiled(x, k), fn(x, k)), (n, k)
    assert torchtpu_compile.stats()["buckets"]["exact_shape_compiles"] == 0


def test_a_bucketed_graph_refuses_inputs_that_overlap_one_it_writes(fresh_dynamo):
    # A static graph raised; a bucketed one skipped the check and returned x * 2 from x as it
    # was before the write through its view w: no error, eager's values missed.
    def writes_w_reads_x(w, x):
        w.add_(1)
        return x * 2

    compiled = compile_tpu(writes_w_reads_x, dynamic=True)
    for n in (6, 9):
        compiled(torch.ones(n - 1), torch.ones(n))
        x = torch.arange(float(n))
        with pytest.raises(RuntimeError, match="overlaps the memory of another"):
            compiled(x[1:], x)
    assert torchtpu_compile.stats()["buckets"]["compiles"] >= 1


def test_an_output_that_views_an_input_keeps_eager_values_and_strides(fresh_dynamo):
    # aot_autograd rebuilds a view of an input from the strides the graph returns; a bucket
    # returned a contiguous copy, so x[..., ::2].expand(2, ...) read the wrong elements
    # (no error) and x.expand(2, ...) raised "setStorage ... out of bounds".
    fn = lambda x: x.expand(2, *x.shape)  # noqa: E731
    compiled = compile_tpu(fn, dynamic=True)
    for n in (6, 10, 14):
        base = torch.arange(n).reshape(1, n).remainder(3).bool()
        for x in (base, base[..., ::2]):
            actual, expected = compiled(x), fn(x)
            assert torch.equal(actual, expected) and actual.stride() == expected.stride()


def _doubles_and_returns_its_back_half(x):
    x.add_(x)
    return x[x.shape[0] // 2:]


def test_an_output_that_views_a_written_input_keeps_its_offset(fresh_dynamo):
    # the output views the input's new value, which aot_autograd rebuilds as a view of the
    # input with the offset the graph returns; a bucket's copy has offset 0, so the output
    # read the input's first rows (fuzz seed 1345, no error)
    compiled = compile_tpu(_doubles_and_returns_its_back_half, dynamic=True)
    for n in (3, 5, 9):
        x = torch.arange(3 * n, dtype=torch.int8).reshape(n, 3)
        x_eager = x.clone()
        actual, expected = compiled(x), _doubles_and_returns_its_back_half(x_eager)
        assert torch.equal(actual, expected) and torch.equal(x, x_eager)
        assert actual.storage_offset() == expected.storage_offset()


def _attend_with_mask(cache, new, mask):
    keys = torch.cat([cache, new], dim=1)                          # (b, s + 1, d)
    scores = (keys @ new.transpose(1, 2)).squeeze(-1) + mask       # mask: (b, s + 1)
    return torch.softmax(scores, -1).unsqueeze(1) @ keys, keys


def test_a_mask_one_longer_than_its_cache_shares_its_bucket(fresh_dynamo):
    # Dynamo sees the mask's length as s + 1 (the cache's s): padded to the cache's bucket
    # plus one, its real elements a prefix, exact at every size, never compiled per shape.
    # (Width 5: no other size equals a mask's length, which would share its symbol.)
    compiled = compile_tpu(_attend_with_mask, dynamic=True)
    with config.patch(matmul_precision="highest"):
        for n in (3, 6, 7):  # one bucket (8; the mask's 9): one compile
            cache, new = torch.randn(2, n, 5), torch.randn(2, 1, 5)
            mask = torch.zeros(2, n + 1)
            mask[:, 0] = -1e9
            _close(compiled(cache, new, mask), _attend_with_mask(cache, new, mask))
    stats = torchtpu_compile.stats()["buckets"]
    assert stats["exact_shape_compiles"] == 0
    assert stats["compiles"] == 1 and stats["hits"] == 2


def test_topk_over_a_padded_dim_never_picks_the_padding(fresh_dynamo):
    # topk pads with -inf; where real elements are -inf too, the unstable sort put padding
    # among the first k, and topk returned positions past the real size. Real elements come
    # first now (ties go to the lowest index).
    def fn(x):
        return torch.topk(x, 12, dim=1), torch.topk(-x, 12, dim=1, largest=False)

    compiled = compile_tpu(fn)
    for i, n in enumerate((20, 21, 40)):
        x = torch.full((2, n), -math.inf)
        x[:, :3] = torch.tensor([1.0, -2.0, 5.0])
        if i == 0:
            torch._dynamo.mark_dynamic(x, 1)
        for (values, indices), (want_values, _) in zip(compiled(x), fn(x)):
            assert torch.equal(values, want_values)
            assert torch.equal(indices, torch.tensor([2, 0, 1] + list(range(3, 12))).expand(2, 12))
    assert torchtpu_compile.stats()["buckets"]["exact_shape_compiles"] == 0


def test_gather_with_real_positions(fresh_dynamo):
    def fn(x, index):
        return torch.gather(x, 1, index), x[:, index[0, :, 0]]

    compiled = compile_tpu(fn)
    with config.patch(matmul_precision="highest"):
        for i, n in enumerate(SIZES):
            x = torch.randn(3, n, 5)
            index = torch.randint(0, n, (3, n, 5))
            if i == 0:
                torch._dynamo.mark_dynamic(x, 1)
                torch._dynamo.mark_dynamic(index, 1)
            _close(compiled(x, index), fn(x, index))
    assert torchtpu_compile.stats()["buckets"]["exact_shape_compiles"] == 0


def test_batch_norm_statistics_and_running_stats_over_dynamic_batch(fresh_dynamo):
    torch.manual_seed(0)
    eager = torch.nn.BatchNorm1d(4).train()
    model = copy.deepcopy(eager)
    compiled = compile_tpu(model)
    for i, n in enumerate(SIZES):
        x = torch.randn(n, 4) * 3 + 1
        if i == 0:
            torch._dynamo.mark_dynamic(x, 0)
        _close(compiled(x), eager(x))
    _close(model.running_mean, eager.running_mean)
    _close(model.running_var, eager.running_var)
    assert torchtpu_compile.stats()["buckets"]["exact_shape_compiles"] == 0


# --- models ------------------------------------------------------------------------------------

def _lengths(count, high, seed):
    rng = random.Random(seed)
    return [rng.randint(1, high) for _ in range(count)]


def test_causal_decoder_over_random_lengths(fresh_dynamo):
    # The 40 lengths in 1..512 of the issue: tests/slow/test_buckets_full.py.
    torch.manual_seed(0)
    model = Decoder(layers=1).eval()
    compiled = compile_tpu(model)
    with config.patch(matmul_precision="highest"), torch.no_grad():
        for i, length in enumerate([5] + _lengths(7, 64, seed=1)):
            ids = torch.randint(0, 64, (2, length))
            if i == 0:
                torch._dynamo.mark_dynamic(ids, 1)
            _close(compiled(ids), model(ids))
    graphs = _graphs()
    assert torchtpu_compile.stats()["buckets"]["exact_shape_compiles"] == 0
    assert max(g["compiles"] for g in graphs.values()) <= 4  # buckets 8, 16, 32, 64
    assert len(graphs) == 1  # one Dynamo graph for every length (none drawn is 1)


def test_kv_cache_decode_loop_compiles_once_per_bucket(fresh_dynamo):
    # HF's DynamicCache: cat the new key onto the cache, attend over it, feed it back. The
    # cache comes back contiguous, as eager's: a strided view of the padded buffer would make
    # Dynamo trace the next step again with its stride as a new size.
    def step(cache, new, query):
        cache = torch.cat([cache, new], dim=-2)
        return cache, F.scaled_dot_product_attention(query, cache, cache)

    compiled = compile_tpu(step)
    torch.manual_seed(0)
    cache = expected = torch.randn(1, 2, 3, 4)
    torch._dynamo.mark_dynamic(cache, 2)
    with config.patch(matmul_precision="highest"):
        for _ in range(10):  # cache lengths 3..12: buckets 8 and 16
            new, query = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4)
            cache, out = compiled(cache, new, query)
            expected, want = step(expected, new, query)
            _close(cache, expected)
            _close(out, want)
            assert cache.is_contiguous()
    graphs = _graphs()
    assert torchtpu_compile.stats()["buckets"]["exact_shape_compiles"] == 0
    assert [g["buckets"] for g in graphs.values()] == [[[8], [16]]]


def test_training_step_with_dynamic_batch_matches_eager(fresh_dynamo):
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = copy.deepcopy(eager)
    opt_eager = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(net, x, y):
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        return loss

    compiled = compile_tpu(step)
    with config.patch(matmul_precision="highest"):
        for i, n in enumerate((5, 12, 3, 9)):
            x, y = torch.randn(n, 16), torch.randint(0, 4, (n,))
            if i == 0:
                torch._dynamo.mark_dynamic(x, 0)
                torch._dynamo.mark_dynamic(y, 0)
            _close(compiled(model, x, y), step(eager, x, y))
            for p, q in zip(model.parameters(), eager.parameters()):
                _close(p.grad, q.grad)
            opt.step(), opt_eager.step()
            opt.zero_grad(), opt_eager.zero_grad()
    for p, q in zip(model.state_dict().values(), eager.state_dict().values()):
        _close(p.float(), q.float())
    stats = torchtpu_compile.stats()
    assert stats["buckets"]["exact_shape_compiles"] == 0
    assert stats["buckets"]["hits"] > 0
    backward = _graphs("backward")
    assert backward and all(g["compiles"] <= 3 for g in backward.values())


# --- sizes Dynamo named apart ------------------------------------------------------------------

# (batch, length) of two tensors: equal, then equal products of unequal sizes (eager accepts
# them: only the flattened rows must agree), then equal again at a bucket seen before
APART = (((2, 9), (2, 9)), ((2, 12), (2, 12)), ((2, 12), (3, 8)), ((3, 20), (3, 20)))


def _named_apart(*tensors):
    # every dim its own symbol, as Dynamo names a model's logits and its labels when the loss
    # runs after a graph break (GPT-2's)
    for t in tensors:
        torch._dynamo.mark_dynamic(t, 0)
        torch._dynamo.mark_dynamic(t, 1)


def _equal_to_eager_apart(fn, inputs):
    """``fn`` compiled, called with ``inputs(a, b)`` at each pair of APART, equal to eager;
    its buckets take the sizes as equal, checked at each call: the unequal call alone runs a
    program of its exact shapes."""
    compiled = compile_tpu(fn)
    for i, (a, b) in enumerate(APART):
        x, y = inputs(a, b)
        if i == 0:
            _named_apart(x, y)
        for actual, expected in zip(compiled(x, y), fn(x, y)):
            assert torch.equal(actual, expected)
    [graph] = _graphs().values()
    assert graph["buckets"] == [[8, 16], [8, 32]] and graph["exact_shape_compiles"] == 1


def test_a_gather_and_a_scatter_add_of_rows_padded_differently_match_eager(fresh_dynamo):
    # The rules paired row i of the index with row i of the padded input whatever their
    # layouts: at (2, 12) against (3, 8) the flattened rows sit at other padded positions, and
    # both results were silently wrong.
    def fn(x, y):
        rows, index = x.flatten(0, 1), y.flatten(0, 1)
        ones = torch.ones_like(index, dtype=rows.dtype)
        return rows.gather(1, index), rows.scatter_add(1, index, ones)
    _equal_to_eager_apart(fn, lambda a, b: (torch.randn(*a, 4), torch.randint(0, 4, (*b, 4))))


def test_an_index_put_of_rows_padded_differently_matches_eager(fresh_dynamo):
    # x[:, i] = rows, and += rows: the rule took the values' padding to be x's own, and at
    # (2, 12) against (3, 8) the program failed to broadcast the values to x's rows.
    def fn(x, y):
        rows, index = y.flatten(0, 1), torch.tensor([0, 2])
        put = torch.ops.aten.index_put.default
        return put(x.flatten(0, 1), [None, index], rows, True), \
            put(x.flatten(0, 1), [None, index], rows * 3)
    _equal_to_eager_apart(fn, lambda a, b: (torch.randn(*a, 4), torch.randn(*b, 2)))


def test_a_loss_over_logits_and_labels_named_apart_trains_per_bucket(fresh_dynamo):
    # GPT-2's loss graph: logits and labels with sizes of their own. Its backward combines
    # the two flattened dims, and compiled once per shape; its forward's gather was silently
    # wrong at (2, 12) against (3, 8).
    def loss(logits, labels):
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))
    compiled = compile_tpu(loss)
    with config.patch(matmul_precision="highest"):
        for i, (a, b) in enumerate(APART):
            logits, labels = torch.randn(*a, 7, requires_grad=True), torch.randint(0, 7, b)
            labels[0, 0] = -100
            if i == 0:
                _named_apart(logits, labels)
            _loss_and_gradient_as_eager(compiled, loss, logits, labels)
    [forward], [backward] = _graphs("/forward").values(), _graphs("/backward").values()
    for graph in (forward, backward):
        assert graph["buckets"] == [[16, 8], [32, 8]] and graph["exact_shape_compiles"] == 1


def _loss_and_gradient_as_eager(compiled, loss, logits, labels):
    reference = logits.detach().clone().requires_grad_()
    actual, expected = compiled(logits, labels), loss(reference, labels)
    actual.backward()
    expected.backward()
    _close(actual, expected)
    _close(logits.grad, reference.grad)


def test_a_shifted_loss_over_sizes_named_apart_trains_per_bucket(fresh_dynamo):
    # GPT2DoubleHeadsModel's LM loss: ``logits[..., :-1, :]`` against ``labels[..., 1:]``, of
    # (b, 2, s) named apart. The sizes taken as equal were symbols only, not ``s - 1`` against
    # ``t - 1``: forward and backward compiled once per shape.
    def loss(logits, labels):
        shifted = logits[..., :-1, :].contiguous()
        return F.cross_entropy(shifted.view(-1, shifted.size(-1)), labels[..., 1:].reshape(-1))
    compiled = compile_tpu(loss)
    with config.patch(matmul_precision="highest"):
        for i, (b, s) in enumerate(((2, 9), (2, 12), (3, 20), (1, 11))):
            logits = torch.randn(b, 2, s, 7, requires_grad=True)
            labels = torch.randint(0, 7, (b, 2, s))
            if i == 0:
                for t in (logits, labels):
                    torch._dynamo.mark_dynamic(t, 0)
                    torch._dynamo.mark_dynamic(t, 2)
            _loss_and_gradient_as_eager(compiled, loss, logits, labels)
    assert torchtpu_compile.stats()["buckets"]["exact_shape_compiles"] == 0


# --- switches and fallbacks --------------------------------------------------------------------

def test_buckets_off_compiles_once_per_shape(fresh_dynamo):
    compiled = compile_tpu(lambda x: x.softmax(0))
    with config.patch(buckets=False):
        for i, n in enumerate((3, 5, 6)):
            x = torch.randn(n)
            if i == 0:
                torch._dynamo.mark_dynamic(x, 0)
            _close(compiled(x), x.softmax(0))
    stats = torchtpu_compile.stats()
    assert stats["buckets"]["compiles"] == 0
    assert [g["compiles"] for g in stats["graphs"].values()] == [3]


def test_graph_without_exact_rule_compiles_per_shape_and_is_counted(fresh_dynamo):
    # searchsorted in a padded sorted sequence has no rule (flip, then a diagonal across two
    # padded dims, the examples before, have one now)
    def fn(x):
        return torch.searchsorted(x.sort().values, x)

    compiled = compile_tpu(fn)
    for i, n in enumerate((3, 5, 5)):
        x = torch.randn(n)
        if i == 0:
            torch._dynamo.mark_dynamic(x, 0)
        _close(compiled(x), fn(x))
    stats = torchtpu_compile.stats()
    assert stats["buckets"]["exact_shape_compiles"] == 2
    assert stats["buckets"]["compiles"] == 0


def test_stats_report_hits_and_padding_waste(fresh_dynamo):
    compiled = compile_tpu(lambda x: x.sum(0))
    for i, n in enumerate((6, 3)):
        x = torch.randn(n)
        if i == 0:
            torch._dynamo.mark_dynamic(x, 0)
        compiled(x)
    graph = next(iter(_graphs().values()))
    assert graph["buckets"] == [[8]] and graph["bucket_hits"] == 1
    assert graph["padding_waste_pct"] == pytest.approx(100 * (16 - 9) / 16, abs=0.01)


def test_sizes_seen_before_skip_bucket_choice_until_a_new_bucket(fresh_dynamo, monkeypatch):
    # A decode loop calls the same graph at the same few sizes: the bucket for each is chosen
    # once. A new bucket can serve sizes seen before better (max_buckets: the smallest
    # covering one), so it makes every size choose again; results stay eager's throughout.
    from torchtpu_compile.buckets import runner
    chosen = []

    def counting_choose(sizes, existing):
        chosen.append(sizes)
        return choose(sizes, existing)

    monkeypatch.setattr(runner, "choose", counting_choose)
    compiled = compile_tpu(lambda x: (x * 2).cumsum(0))
    with config.patch(bucket_policy="pow2-128", bucket_min=8, max_buckets=2):
        for i, n in enumerate((5, 5, 6, 5, 6, 40, 6, 20, 20)):
            x = torch.randn(n)
            if i == 0:
                torch._dynamo.mark_dynamic(x, 0)
            _close(compiled(x), (x * 2).cumsum(0))
    # 5 and 6 once each; 40 (new bucket 64) clears them; 6 again; 20 (covered by 64) once
    assert chosen == [(5,), (6,), (40,), (6,), (20,)]
    graph = next(iter(_graphs().values()))
    assert graph["buckets"] == [[8], [64]] and graph["bucket_hits"] == 7


def test_sizes_seen_before_pad_and_cut_back_without_evaluating_sizes(fresh_dynamo, monkeypatch):
    # A decode step pads its inputs and cuts back its outputs at the same sizes call after
    # call: the shapes come from the layouts' size expressions once per sizes, not per call
    # (they were most of the bucketed decode step's Python).
    from torchtpu_compile.buckets import layout
    evaluated = []

    def counting_evaluate(expr, env):
        evaluated.append(expr)
        return evaluate(expr, env)

    evaluate = layout.evaluate
    monkeypatch.setattr(layout, "evaluate", counting_evaluate)
    compiled = compile_tpu(lambda x, y: (torch.cat([x, y], 1).softmax(1), x.sum(1)))
    y = torch.randn(3, 1, 5)
    with config.patch(matmul_precision="highest"):
        for i, n in enumerate((5, 6, 5, 6, 6)):
            x = torch.randn(3, n, 5)
            if i == 0:
                torch._dynamo.mark_dynamic(x, 1)
            if i == 2:
                evaluated.clear()
            _close(compiled(x, y), (torch.cat([x, y], 1).softmax(1), x.sum(1)))
    assert evaluated == []  # 5 and 6 seen before



@pytest.mark.parametrize("ahead", [True, False])
def test_background_builds_the_next_bucket_before_it_is_needed(ahead, fresh_dynamo):
    from torchtpu_compile.buckets import background
    compiled = compile_tpu(lambda x: (x * 2).cumsum(0))
    with config.patch(background_buckets=ahead, bucket_policy="pow2-128", bucket_min=8):
        for i, n in enumerate((5, 12, 7)):
            x = torch.randn(n)
            if i == 0:
                torch._dynamo.mark_dynamic(x, 0)
            _close(compiled(x), (x * 2).cumsum(0))
            assert background.wait_idle(120)
            graph = next(iter(_graphs().values()))
            if i == 0:  # bucket 8 for the call; with ahead, 16 built meanwhile
                assert sorted(graph["buckets"]) == ([[8], [16]] if ahead else [[8]])
    buckets = torchtpu_compile.stats()["buckets"]
    # 12 found bucket 16 ready (a hit) and had 32 built ahead; 7 is a hit either way
    assert sorted(graph["buckets"]) == ([[8], [16], [32]] if ahead else [[8], [16]])
    assert graph["bucket_hits"] == (2 if ahead else 1)
    assert buckets["built_ahead"] == (2 if ahead else 0)
    assert graph["compiles"] == len(graph["buckets"])


def test_inputs_eager_refuses_raise_from_a_padded_graph(fresh_dynamo):
    # one_hot's class values are checked by a torch._assert_async its decomposition leaves in
    # the graph, and var refuses integers: padded graphs dropped both (a row of zeros for an
    # out-of-range class, 2.5 for var(arange(5))) where static graphs fell back to eager.
    one_hot = torch.compile(lambda t: F.one_hot(t, 3) * 2, backend="torchtpu", dynamic=True)
    for good in ([0, 1, 2], [2, 2, 0, 1, 1]):
        t = torch.tensor(good)
        assert torch.equal(one_hot(t), F.one_hot(t, 3) * 2)
    for bad, message in (([0, 3, 1], "must be smaller than num_classes"),
                         ([0, -1, 2, 1], "must be non-negative")):
        with pytest.raises(RuntimeError, match=message):
            one_hot(torch.tensor(bad))
    assert torch.equal(one_hot(torch.tensor([1, 0])), F.one_hot(torch.tensor([1, 0]), 3) * 2)
    variance = torch.compile(lambda t: torch.var(t), backend="torchtpu", dynamic=True)
    with pytest.raises(RuntimeError, match="std and var only support floating point"):
        variance(torch.arange(5))
