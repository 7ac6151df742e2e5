"""The indexing and scatter decompositions
(torchtpu_compile/lower/decompositions/indexing_scatter.py) against eager CPU PyTorch, in strict
mode: the op must run through XLA, not fall back, and give eager's numbers (negative indices,
masks, repeated targets)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchtpu_compile

from tests.support.decomposition_checks import NAN, check, check_on_both_paths, randn
from tests.support.helpers import compile_tpu
from torchtpu_compile import config

pytestmark = pytest.mark.usefixtures("fresh_dynamo")
aten = torch.ops.aten


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


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_around_slices_runs_on_the_device(accumulate):
    # x[b, :, p] = v (a per-row KV cache write, a paged cache's) ran on the host: torch-mlir
    # lowers no index_put with a None between indices. Index dims apart and adjacent, values
    # broadcast, duplicates accumulated, negative indices.
    cases = [([[0, 2], None, [1, -1]], (2, 4, 6)), ([None, [1, 3]], (3, 2, 5, 6)),
             ([None, [1, 3], [0, 4]], (3, 2, 6)), ([None, None, [-1, 2], [5, 0]], (3, 4, 2)),
             ([[[0], [2]], None, [1, 1]], (2, 2, 4, 6)), ([None, [1, 3], None, [0, 4]], (5,)),
             ([None, [1, 1]], (1, 5, 6))]
    for k, (index, shape) in enumerate(cases):
        indices = [None if i is None else torch.tensor(i) for i in index]
        check_on_both_paths(
            lambda x, v, indices=indices: torch.ops.aten.index_put(x, indices, v, accumulate),
            randn(3, 4, 5, 6), randn(*shape, seed=k), rtol=1e-6, atol=1e-6)


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


def test_scatter_of_one_entry_per_row_matches_eager():
    # One index per row along dim (a one-hot) is a compare and a select; other indices stay a
    # scatter. A float value into integers is cast, as scatter does.
    def scatters(x, src, y, rows, cols, pairs, deep):
        return [x.scatter(1, rows, -1.0), x.scatter(-1, rows, src), x.scatter(0, cols, src),
                x.scatter(1, pairs[:, :1], 2.5), x.scatter(1, pairs, src),  # pairs: not one
                torch.zeros_like(rows).expand(4, 6).scatter(1, rows, 2.7),
                y.scatter(2, deep, 7.0)]
    check_on_both_paths(scatters, randn(4, 6), randn(4, 6, seed=1), randn(2, 3, 5, seed=2),
                        torch.tensor([[5], [0], [2], [5]]), torch.tensor([[3, 0, 2, 1, 2, 0]]),
                        torch.tensor([[1, 2], [0, 3], [3, 4], [5, 0]]),
                        torch.tensor([[[4], [0], [1]], [[2], [3], [4]]]))


def test_scatter_of_one_entry_per_row_out_of_range_raises_as_eager():
    x, index = torch.zeros(2, 4), torch.tensor([[1], [4]])
    with pytest.raises(RuntimeError) as expected:
        x.scatter(1, index, 1.0)
    with pytest.raises(type(expected.value), match="out of bounds"):
        compile_tpu(lambda x, i: x.scatter(1, i, 1.0))(x, index)


def test_cross_entropy_backward_is_a_select_not_a_scatter():
    # nll_loss's backward wrote its one-hot by scatter, which XLA keeps as a (tokens x
    # vocabulary) buffer of its own; a select fuses into what reads it.
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchtpu_compile.lower.decompositions import decomposition_table

    def loss_grad(logits, target):
        return torch.autograd.grad(F.cross_entropy(logits, target), logits)

    logits = randn(8, 11).requires_grad_()
    graph = make_fx(loss_grad, decomposition_table=decomposition_table())(
        logits, torch.tensor([3, 0, 10, 2, 2, 7, 1, 4]))
    targets = {node.target for node in graph.graph.nodes if node.op == "call_function"}
    assert not targets & {aten.scatter.value, aten.scatter.src}, targets
    target = torch.tensor([3, 0, 10, 2, 2, 7, 1, -100])  # the last ignored
    grads = []
    for run in (compile_tpu(F.cross_entropy), F.cross_entropy):
        x = logits.detach().requires_grad_()
        with config.patch(strict=True):
            run(x, target).backward()
        grads.append(x.grad)
    torch.testing.assert_close(*grads)


def test_index_copy_of_one_position_is_a_select_not_a_scatter():
    # A static KV cache's decode step (transformers' StaticCache: cache.index_copy_(2,
    # cache_position, new)) was a scatter giving every element its own index, which XLA CPU
    # runs as a loop over each element of the update; one position is a compare and a select.
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchtpu_compile.lower.decompositions import decomposition_table

    cache, new, position = randn(1, 4, 6, 8), randn(1, 4, 1, 8, seed=1), torch.tensor([3])
    graph = make_fx(lambda c, p, n: c.index_copy(2, p, n),
                    decomposition_table=decomposition_table())(cache, position, new)
    targets = {node.target for node in graph.graph.nodes if node.op == "call_function"}
    assert not targets & {aten.index_copy.default, aten.index_put.default,
                          aten.scatter.src, aten.scatter.value}, targets

    def writes(x, position, new, first, several, last):
        return [x.index_copy(2, position, new), x.index_copy(-2, position, new),
                x.index_copy(0, first, x * 2), (x > 0).index_copy(2, position, new > 0),
                x.index_copy(2, several, torch.cat([new, new * 3], 2)),  # repeated: the last
                x.index_fill(1, last, 3.0)]  # through index_copy, its index counted from the end
    check_on_both_paths(writes, cache, position, new, torch.tensor([0]), torch.tensor([5, 5]),
                        torch.tensor([-1]))

    def decode_step(cache, position, new):  # written in place, then read
        cache.index_copy_(2, position, new)
        return cache * 2
    ours, theirs = cache.clone(), cache.clone()
    with config.patch(strict=True):
        out = compile_tpu(decode_step)(ours, torch.tensor([5]), new)
    torch.testing.assert_close(out, decode_step(theirs, torch.tensor([5]), new), rtol=0, atol=0)
    assert torch.equal(ours, theirs)


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


def test_segment_reduce_of_offsets_not_spanning_the_axis_and_unsafe_lengths():
    # Offsets that do not start at 0 or end at the axis's length leave positions in no
    # segment, as unsafe lengths that fall short do: the decomposition counted segments from 0
    # and put every leftover in the last one ([1, 9] where eager gives [3, 7]).
    data = torch.arange(5.0)

    def segments(data, starting_late, ending_early, short):
        return [torch.segment_reduce(data, reduce, **options)
                for reduce in ("sum", "max", "mean")
                for options in (dict(offsets=starting_late), dict(offsets=ending_early),
                                dict(lengths=short, unsafe=True))]
    check_on_both_paths(segments, data, torch.tensor([1, 3, 5]), torch.tensor([0, 3, 4]),
                        torch.tensor([2, 2]))


@pytest.mark.parametrize("options", [
    dict(lengths=torch.tensor([2, 2])), dict(lengths=torch.tensor([6, -1])),
    dict(offsets=torch.tensor([0, 3, 2, 5])), dict(lengths=torch.tensor([6, -1]), unsafe=True),
], ids=["lengths_short", "negative_length", "decreasing_offsets", "negative_unsafe"])
def test_segment_reduce_raises_eagers_errors_for_bad_lengths(options):
    # The decomposition reduced whatever the lengths said: [1, 9] for lengths adding up to 4
    # of 5 elements, where eager raises.
    data = torch.arange(5.0)
    with pytest.raises(RuntimeError) as expected:
        torch.segment_reduce(data, "sum", **options)
    message = str(expected.value).split("  (")[0]
    with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compile_tpu(lambda d, **o: torch.segment_reduce(d, "sum", **o))(data, **options)


# --- embedding bags --------------------------------------------------------------------------

#: Weights with a tie (rows 1 and 4) and a NaN, indices (every one twice: CPU's
#: scale_grad_by_freq divides by a neighbour's count, see below) with empty bags.
BAG_INDICES = torch.tensor([1, 2, 4, 5, 0, 3, 3, 6, 6, 1, 2, 4, 5, 0], dtype=torch.int32)
BAG_OFFSETS = torch.tensor([0, 2, 2, 5, 7, 7, 11, 14], dtype=torch.int32)


def bag_weights():
    w = randn(7, 3)
    w[4] = w[1]
    w[6, 0] = NAN
    return w


def every_bag(w, idx, offsets, per_sample):
    # Every mode and output: without padding, then with padding and a last offset.
    outs = []
    for mode in (0, 1, 2):
        outs.append(aten._embedding_bag(w, idx, offsets[:-1], False, mode, False, None, False,
                                        -1))
        outs.append(aten._embedding_bag(w, idx, offsets, False, mode, False, None, True, 2))
    outs.append(aten._embedding_bag_forward_only(w, idx, offsets[:-1], False, 0, False,
                                                 per_sample, False, -1))
    return outs


def every_bag_backward(grad, w, idx, offsets, per_sample):
    outs = []
    for mode, freq, pad in ((0, False, -1), (0, True, 2), (1, False, -1), (1, True, 2),
                            (2, False, -1), (2, False, 2)):
        _, offset2bag, size, max_indices = aten._embedding_bag(w, idx, offsets, freq, mode,
                                                               False, None, False, pad)
        outs.append(aten._embedding_bag_backward(grad, idx, offsets, offset2bag, size,
                                                 max_indices, w.shape[0], freq, mode, False,
                                                 None, pad))
    _, offset2bag, size, max_indices = aten._embedding_bag(w, idx, offsets, False, 0, False,
                                                           per_sample, False, 2)
    outs.append(aten._embedding_bag_backward(grad, idx, offsets, offset2bag, size, max_indices,
                                             w.shape[0], False, 0, False, per_sample, 2))
    outs.append(aten._embedding_bag_per_sample_weights_backward(grad, w, idx, offsets,
                                                                offset2bag, 0, 2))
    return outs


def a_few_bags(grad, w, idx, offsets, per_sample):
    # Each mode once (max with a tie and a NaN, mean with padding and a last offset, sum with
    # per-sample weights), every output, and the gradients of max and of the weighted sum.
    outs = [aten._embedding_bag(w, idx, offsets[:-1], False, 2, False, None, False, -1),
            aten._embedding_bag(w, idx, offsets, False, 1, False, None, True, 2),
            aten._embedding_bag(w, idx, offsets[:-1], False, 0, False, per_sample, False, -1)]
    _, offset2bag, size, max_indices = outs[0]
    outs.append(aten._embedding_bag_backward(grad, idx, offsets[:-1], offset2bag, size,
                                             max_indices, 7, False, 2, False, None))
    outs.append(aten._embedding_bag_backward(grad, idx, offsets[:-1], outs[2][1], outs[2][2],
                                             outs[2][3], 7, False, 0, False, per_sample))
    outs.append(aten._embedding_bag_per_sample_weights_backward(grad, w, idx, offsets[:-1],
                                                                outs[2][1], 0))
    return outs


def test_embedding_bag_each_mode_and_gradient_as_cpu_computes_them():
    # Unlowered: nn.EmbeddingBag (text classification) ran on the host, both ways. Every
    # output as CPU's, empty bags, max's ties (the first position wins) and NaN (one first in
    # its bag stays, as CPU compares each value with the running maximum), int32 indices.
    # Every mode with and without padding, on both paths: tests/slow/test_decompositions_full.py.
    check(a_few_bags, randn(7, 3, seed=2), bag_weights(), BAG_INDICES, BAG_OFFSETS,
          randn(14, seed=1), rtol=1e-6, atol=1e-6)


def test_embedding_bag_scales_by_each_index_own_frequency():
    # scale_grad_by_freq divides each row's gradient by how often its index occurs, as the
    # documentation says and nn.Embedding does. CPU's bag kernel divides the k-th distinct
    # index's by the count of the k-th *sorted* index instead (indices 4 and 5 here get 1/2,
    # not 1): we follow the documented meaning (the other tests use indices whose counts are
    # equal, where both agree).
    grad = randn(3, 3, seed=2)
    idx, offsets = torch.tensor([1, 2, 4, 5, 0, 3, 3, 1, 2]), torch.tensor([0, 2, 5])
    bag = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2, 2])
    want = aten.embedding_dense_backward(grad[bag], idx, 7, -1, True)
    got = compile_tpu(lambda g, i, o: aten._embedding_bag_backward(
        g, i, o, i.new_empty(0), i.new_zeros(3), i.new_zeros(3), 7, True, 0, False, None))(
        grad, idx, offsets)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("norm_type", [2.0, 1.0])
def test_embedding_max_norm_renormalizes_looked_up_rows_through_xla(norm_type):
    # nn.Embedding(max_norm=...) rescales, in place, each looked-up row whose norm exceeds
    # max_norm, every forward: embedding_renorm ran on the host (strict: an error) on both
    # paths. Repeated indices, rows under the norm, rows not looked up; output, weight, grad.
    idx = torch.tensor([[1, 2, 2], [7, 1, 9]])

    def step(emb, idx):
        out = emb(idx)
        out.square().sum().backward()
        return out, emb.weight.detach(), emb.weight.grad

    def embedding():
        emb = torch.nn.Embedding(10, 4, max_norm=2.0, norm_type=norm_type)
        with torch.no_grad():
            emb.weight.copy_(randn(10, 4) * 2)
        return emb

    want = step(embedding(), idx)
    with config.patch(strict=True):
        compiled = step(compile_tpu(embedding()), idx)
        device = step(embedding().to("tpu"), idx.to("tpu"))
    torch.testing.assert_close(compiled, want)
    torch.testing.assert_close([t.cpu() for t in device], list(want))


def test_embedding_bag_module_trains_on_the_device():
    # nn.EmbeddingBag's autograd on the tpu device, strict: nothing may run on the host.
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(9, 4, mode="mean", padding_idx=0)
    text, offsets = torch.tensor([3, 0, 8, 1, 1, 5, 2]), torch.tensor([0, 3, 3])
    bag(text, offsets).square().sum().backward()
    want = bag.weight.grad.clone()
    bag.to("tpu").weight.grad = None
    with config.patch(strict=True):
        bag(text.to("tpu"), offsets.to("tpu")).square().sum().backward()
    torch.testing.assert_close(bag.weight.grad.cpu(), want, rtol=1e-6, atol=1e-6)


def test_embedding_bag_of_varying_lengths_compiles_per_bucket():
    # A text classifier's batches hold a different number of tokens each: one program per
    # bucket, not per length, in every mode, with eager's values.
    def bags(w, text, offsets):
        return [F.embedding_bag(text, w, offsets, mode=mode, padding_idx=3)
                for mode in ("sum", "mean", "max")]
    compiled = compile_tpu(bags, dynamic=True)
    w = randn(12, 4)
    for n in (5, 7, 6):
        text = torch.randint(0, 12, (n,), generator=torch.Generator().manual_seed(n))
        offsets = torch.tensor([0, 2, 2, n - 1])
        torch.testing.assert_close(compiled(w, text, offsets), bags(w, text, offsets))
    buckets = torchtpu_compile.stats()["buckets"]
    assert buckets["exact_shape_compiles"] == 0 and buckets["compiles"] == 1, buckets


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


def test_half_width_embedding_bag_mean_rounds_each_sum_first():
    # CPU's kernel rounds a bf16 bag's sum to bf16, then divides by its size: dividing the
    # float32 sum rounded differently (one bf16 step apart in 187 of 800 elements of 20 draws).
    generator = torch.Generator().manual_seed(0)
    weight = torch.rand(50, 8, generator=generator) + 0.5
    indices = torch.randint(0, 50, (400,), generator=generator)
    offsets = torch.tensor([0, 37, 150, 151, 300])
    check_on_both_paths(lambda w, i, o: F.embedding_bag(i, w.bfloat16(), o, mode="mean"),
                        weight, indices, offsets)


def test_gather_and_scatters_of_0d_tensors_run_through_xla():
    # torch-mlir fails to legalize gather, scatter and scatter_add of 0-d tensors: they ran
    # on the host (OpInfo's reference inputs), gather on the compile path too.
    x, index, src = torch.tensor(1.5), torch.tensor(0), torch.tensor(-2.5)

    def zero_d(x, index, src):
        return (torch.gather(x, 0, index), torch.gather(x, -1, index.reshape(1)),
                torch.scatter(x, 0, index, src), torch.scatter(x, -1, index, 4.0),
                torch.scatter_add(x, 0, index, src))
    check_on_both_paths(zero_d, x, index, src)
    with pytest.raises(RuntimeError, match="index 1 is out of bounds for dimension 0 with "
                                           "size 1"):   # eager's error and message
        compile_tpu(zero_d)(x, torch.tensor(1), src)


@pytest.mark.parametrize("options", [dict(sparse=True), dict(scale_grad_by_freq=True),
                                     dict(sparse=True, scale_grad_by_freq=True, padding_idx=0)],
                         ids=["sparse", "scale_grad_by_freq", "both"])
def test_embedding_whose_options_shape_only_the_gradient_lowers(options):
    # torch-mlir refused to legalize aten.embedding with sparse or scale_grad_by_freq set,
    # and the lookup ran on the host (strict mode here fails on that).
    w = randn(5, 5)
    i = torch.tensor([[0, 1, 4], [2, 2, 3], [1, 0, 0]])
    check_on_both_paths(lambda w, i: torch.nn.functional.embedding(i, w, **options), w, i)
