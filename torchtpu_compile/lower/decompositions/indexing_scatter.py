"""Indexing and scatter: negative indices wrapped (torch-mlir's gather reads them as they are),
take and put as flat index_select and index_put, index_put as one scatter of rows, and the
scatter reductions torch-mlir leaves unlowered (scatter_reduce, scatter with a reduce,
index_reduce, segment_reduce), embedding bags (forward and backward) built on them, and
nn.Embedding's max_norm (embedding_renorm).

Example::

    table = decomposition_table()
    table[torch.ops.aten.take.default](torch.arange(4.0), torch.tensor([-1]))   # [3.]
"""
from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false

from .common import as_itself, calling_itself, computing_dtype, torch_decomposition
from .registry import decomposition

aten = torch.ops.aten


# --- indexing --------------------------------------------------------------------------------

@decomposition(aten.index.Tensor)
def index(x, indices):
    # torch-mlir's gather does not wrap negative indices: x[..., [-2], :] (Falcon's fused QKV
    # split) read the wrong elements, silently. Wrap them, then index as usual; the flag lets
    # that inner call through to the op itself.
    if calling_itself(aten.index.Tensor):
        return NotImplemented
    return as_itself(aten.index.Tensor, x, _wrap_negative(x, indices))


def _wrap_negative(x, indices) -> list:
    """Integer ``indices`` (of aten.index / index_put) with negative entries counted from
    the end of their dim; None gaps and boolean masks kept."""
    wrapped, dim = [], 0
    for i in indices:
        if i is not None and i.dtype in (torch.bool, torch.uint8):
            dim += i.dim()  # a mask spans as many dims as it has
        else:
            if i is not None:
                i = torch.where(i < 0, i + x.shape[dim], i)
            dim += 1
        wrapped.append(i)
    return wrapped


@decomposition(aten.index_put.default)
def index_put(x, indices, values, accumulate=False):
    # torch-mlir leaves a torch.constant.int behind (x[idx] = v with a 1-d index). With integer
    # indices on the leading dims: one linear index into the flattened leading dims, then a
    # scatter (or scatter-add) of rows. Otherwise (None gaps, boolean masks) the op stays, its
    # negative indices wrapped first, as for index (backward of x[..., [-2], :]).
    # Eager takes indices on the CPU for a tensor on a device (y[torch.tensor([0, 2])] = s
    # with y on tpu), and a CPU 0-d value: here they meet tpu tensors, so they move first.
    indices = [i if i is None or i.device == x.device else i.to(x.device) for i in indices]
    values = values.to(x.device)
    if len(indices) == 1 and indices[0] is not None and indices[0].dtype == torch.bool:
        # x[mask] = v with v the same for every selected element (it broadcasts over the dims
        # the mask leaves): a select, no data-dependent shapes.
        mask = indices[0]
        rest = x.dim() - mask.dim()
        if values.dim() <= rest:
            mask = mask.view(list(mask.shape) + [1] * rest)
            values = values.to(x.dtype)
            if accumulate:
                return x + torch.where(mask, values, torch.zeros_like(x))
            return torch.where(mask, values, x)
    if _none_between(indices) and all(i is None or i.dtype != torch.bool for i in indices):
        return _index_put_around_slices(x, indices, values, accumulate)
    if any(i is None for i in indices) or any(i.dtype == torch.bool for i in indices):
        if calling_itself(aten.index_put.default):
            return NotImplemented
        return as_itself(aten.index_put.default, x, _wrap_negative(x, indices), values,
                         accumulate)
    k = len(indices)
    lead, rest = list(x.shape[:k]), list(x.shape[k:])
    index = torch.broadcast_tensors(*indices)
    linear = torch.zeros(index[0].shape, dtype=torch.int64)
    for i, size in zip(index, lead):
        linear = linear * size + torch.where(i < 0, i + size, i)
    rows = linear.reshape(-1)
    count = 1
    for size in lead:
        count *= size
    flat = x.reshape([count] + rest)
    vals = values.to(x.dtype).expand(list(linear.shape) + rest).reshape([rows.shape[0]] + rest)
    where = rows.view([-1] + [1] * len(rest)).expand(vals.shape)
    if accumulate:
        flat = flat.scatter_add(0, where, vals)
    else:
        flat = flat.scatter(0, where, vals)
    return flat.reshape(x.shape)


def _none_between(indices) -> bool:
    given = [d for d, i in enumerate(indices) if i is not None]
    return bool(given) and any(indices[d] is None for d in range(given[0], given[-1]))


def _index_put_around_slices(x, indices, values, accumulate):
    # x[b, :, p] = v (a per-row KV cache write, a paged cache's): torch-mlir lowers no
    # index_put with a None between index tensors, so it ran on the host (leading Nones it
    # lowers, and padded graphs keep that op whole: buckets/rules.py). The indexed dims moved
    # to the front, it is the leading-dims scatter above. Eager lays the values out with the
    # broadcast index dims first (they are apart), or where the indexed dims were.
    dims = [d for d, i in enumerate(indices) if i is not None]
    others = [d for d in range(x.dim()) if d not in dims]
    order = dims + others
    block = list(torch.broadcast_shapes(*(indices[d].shape for d in dims)))
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    start = dims[0] if adjacent else 0
    shape = [x.shape[d] for d in others]
    laid_out = values.to(x.dtype).expand(shape[:start] + block + shape[start:])
    if start:  # the index block to the front, as the permuted x has it
        n = len(block)
        laid_out = laid_out.permute(list(range(start, start + n)) + list(range(start)) +
                                    list(range(start + n, laid_out.dim())))
    out = index_put(x.permute(order), [indices[d] for d in dims], laid_out, accumulate)
    return out.permute([order.index(d) for d in range(x.dim())]).contiguous()


@decomposition(aten.take.default)
def take(x, index):
    # torch-mlir's take does not wrap negative indices (they count from the end in eager), and
    # indexing with ``index`` itself made tracing a 0-dim index on the eager device ask for a
    # data-dependent size. A flat index_select of any rank, negative indices wrapped.
    flat = index.reshape(-1)
    flat = torch.where(flat < 0, flat + x.numel(), flat)
    return x.reshape(-1).index_select(0, flat).reshape(index.shape)


@decomposition(aten.put.default)
def put(x, index, source, accumulate=False):
    # Unlowered; take's inverse: a flat index_put, negative indices counted from the end.
    flat = index.reshape(-1)
    flat = torch.where(flat < 0, flat + x.numel(), flat)
    return x.reshape(-1).index_put((flat,), source.reshape(-1), accumulate).reshape(x.shape)


# --- embedding ---------------------------------------------------------------------------------

@decomposition(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    # scale_grad_by_freq and sparse shape the gradient only (autograd's formula, above this
    # table), not the rows the forward reads; torch-mlir refused to legalize the op with either
    # set, and the lookup ran on the host.
    if not (scale_grad_by_freq or sparse):
        return NotImplemented
    return aten.embedding.default(weight, indices, padding_idx)


# --- embedding max_norm ----------------------------------------------------------------------

@decomposition(aten.embedding_renorm.default)
def embedding_renorm(weight, indices, max_norm, norm_type):
    # Unlowered: nn.Embedding(max_norm=...) renormalizes the rows it looks up in every forward,
    # so each step of such a model ran this on the host. CPU's kernel: each distinct looked-up
    # row whose norm exceeds max_norm is scaled by max_norm / (norm + 1e-7); the others stay.
    # Static shapes: the norm of every row, applied where a row was looked up.
    if weight.dim() != 2:
        return NotImplemented
    rows = weight.shape[0]
    flat = indices.reshape(-1).to(torch.int64)
    flat = torch.where(flat < 0, flat + rows, flat)
    looked_up = torch.zeros(rows, dtype=torch.bool).index_put(
        (flat,), torch.ones((), dtype=torch.bool))
    acc = computing_dtype(weight.dtype)
    norm = torch.linalg.vector_norm(weight.to(acc), norm_type, dim=1)
    scale = torch.where(looked_up & (norm > max_norm), max_norm / (norm + 1e-7),
                        torch.ones((), dtype=acc))
    return (weight.to(acc) * scale[:, None]).to(weight.dtype)


# --- embedding bags --------------------------------------------------------------------------

_SUM, _MEAN, _MAX = 0, 1, 2
_NEVER = 1 << 62   # the position of nothing, past any real one
#: Largest (bags x indices x dim) reduction the max mode may build.
_DENSE_BAG_LIMIT = 1 << 28


def _bag_of_each_index(offsets, n: int, bags: int):
    """``offset2bag``: the bag each of ``n`` indices belongs to, from the bags' first offsets
    (one count at each start, then a running sum). Past the last start is the last bag, as on
    CPU, which ignores ``include_last_offset``'s final offset."""
    starts = offsets[:bags].to(torch.int64)
    counts = torch.zeros(n + 1, dtype=torch.int64).index_add(0, starts, torch.ones_like(starts))
    return (torch.cumsum(counts, 0)[:n] - 1).clamp(min=0)


def _kept(indices, padding_idx: int):
    """Which indices count (all but ``padding_idx``'s)."""
    if padding_idx >= 0:
        return indices != padding_idx
    return torch.ones(indices.shape, dtype=torch.bool)


@decomposition(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    # Unlowered (text classification's nn.EmbeddingBag ran on the host, both ways). Each
    # index's row, weighted (padding 0, per-sample weights) and added into its bag; mean
    # divides by the bag's count; max keeps CPU's pick: the first position holding the bag's
    # largest value, except that a NaN in a bag's first position stays (CPU compares each
    # value with the running maximum, and nothing is greater than NaN). Empty bags give 0.
    # The other outputs are CPU's too (offset2bag empty on its fast sum path; bag_size and
    # max_indices zeros for sum, max_indices = bag_size for mean).
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    if indices.dim() != 1 or offsets.dim() != 1 or bags < 1 or (
            per_sample_weights is not None and mode != _SUM):
        return NotImplemented
    n, dim = indices.shape[0], weight.shape[1]
    if mode == _MAX and isinstance(n, int) and bags * n * dim > _DENSE_BAG_LIMIT:
        return NotImplemented   # max's (bags x n x dim) reduction: beyond this, the host
    itype = indices.dtype
    bag = _bag_of_each_index(offsets, n, bags)
    keep = _kept(indices, padding_idx)
    rows = weight.index_select(0, indices)
    size = torch.zeros(bags, dtype=torch.int64).index_add(0, bag, keep.to(torch.int64)).to(itype)
    if mode == _MAX:
        out, chosen = _bag_max(rows, bag, keep, bags)
        max_indices = torch.zeros(bags, dim, dtype=itype)
        if n:
            found = chosen < _NEVER
            max_indices = torch.where(found, indices[torch.where(found, chosen, 0)], max_indices)
        return out, bag.to(itype), size, max_indices
    acc = computing_dtype(weight.dtype)
    scale = keep.to(acc)
    if per_sample_weights is not None:
        scale = scale * per_sample_weights.to(acc)
    out = torch.zeros(bags, dim, dtype=acc).index_add(0, bag, rows.to(acc) * scale[:, None])
    if mode == _MEAN:
        # CPU's kernel rounds each bag's sum to the weight's dtype, then divides.
        out = out.to(weight.dtype).to(acc) / size.clamp(min=1).to(acc)[:, None]
        return out.to(weight.dtype), bag.to(itype), size, size
    fast = padding_idx < 0 and weight.dtype in (torch.float32, torch.float16, torch.bfloat16)
    offset2bag = indices.new_zeros(0) if fast else bag.to(itype)
    zeros = torch.zeros(bags, dtype=itype)
    return out.to(weight.dtype), offset2bag, zeros, zeros


def _bag_max(rows, bag, keep, bags: int):
    """(each bag's maximum per column, the position it came from: ``_NEVER`` for an empty
    bag). Bags are runs of positions: each bag's values are reduced over a (bags x n) mask, a
    fused reduction, not a dense scatter table (scatter_reduce's amax compares every source
    element with every target element, columns included)."""
    n, dim = rows.shape
    if n == 0:
        return rows.new_zeros(bags, dim), torch.full((bags, dim), _NEVER, dtype=torch.int64)
    member = (bag[None, :] == torch.arange(bags)[:, None]) & keep[None, :]       # bags x n
    values = torch.where(torch.isnan(rows), float("-inf"), rows)[None]          # 1 x n x dim
    best = torch.where(member[:, :, None], values, float("-inf")).amax(1)        # bags x dim
    never = torch.full((), _NEVER, dtype=torch.int64)
    hit = member[:, :, None] & (values == best[:, None, :])
    chosen = torch.where(hit, torch.arange(n)[None, :, None], never).amin(1)
    first = torch.where(member, torch.arange(n)[None, :], never).amin(1)         # bags
    first_found = first < _NEVER
    first_is_nan = first_found[:, None] & torch.isnan(rows[torch.where(first_found, first, 0)])
    chosen = torch.where(first_is_nan, first[:, None].expand(bags, dim), chosen)
    found = chosen < _NEVER
    out = torch.where(found, rows.gather(0, torch.where(found, chosen, 0)),
                      torch.zeros((), dtype=rows.dtype))
    return out, chosen


@decomposition(aten._embedding_bag_backward.default)
def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
                           num_weights, scale_grad_by_freq, mode, sparse,
                           per_sample_weights, padding_idx=-1):
    # Unlowered. The dense gradient: sum and mean send each bag's gradient back to its rows
    # (times the per-sample weight, over the bag's count for mean, over the index's frequency
    # with scale_grad_by_freq; padding gets nothing); max sends it to the row each column
    # came from. offset2bag is made again from the offsets (CPU's fast path leaves it empty).
    if sparse or indices.dim() != 1:
        return NotImplemented
    n, (bags, dim) = indices.shape[0], grad.shape
    acc = computing_dtype(grad.dtype)
    if mode == _MAX:
        nonempty = (bag_size > 0)[:, None]
        flat = (maximum_indices.to(torch.int64) * dim + torch.arange(dim)).reshape(-1)
        values = torch.where(nonempty, grad.to(acc), torch.zeros((), dtype=acc)).reshape(-1)
        out = torch.zeros(num_weights * dim, dtype=acc).index_add(0, flat, values)
        return out.reshape(num_weights, dim).to(grad.dtype)
    bag = _bag_of_each_index(offsets, n, bags)
    keep = _kept(indices, padding_idx)
    scale = keep.to(acc)
    if per_sample_weights is not None:
        scale = scale * per_sample_weights.to(acc)
    if mode == _MEAN:
        count = torch.zeros(bags, dtype=acc).index_add(0, bag, keep.to(acc))
        scale = scale / count.clamp(min=1)[bag]
    idx = indices.to(torch.int64)
    if scale_grad_by_freq:
        freq = torch.zeros(num_weights, dtype=acc).index_add(0, idx, torch.ones(n, dtype=acc))
        scale = scale / freq[idx]
    rows = grad.to(acc)[bag] * scale[:, None]
    return torch.zeros(num_weights, dim, dtype=acc).index_add(0, idx, rows).to(grad.dtype)


@decomposition(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode,
                                              padding_idx=-1):
    # Unlowered: each per-sample weight's gradient is its row dotted with its bag's gradient.
    if mode != _SUM or indices.dim() != 1:
        return NotImplemented
    bag = _bag_of_each_index(offsets, indices.shape[0], grad.shape[0])
    acc = computing_dtype(grad.dtype)
    dots = (grad.to(acc)[bag] * weight.index_select(0, indices).to(acc)).sum(-1)
    return torch.where(_kept(indices, padding_idx), dots, torch.zeros((), dtype=acc)) \
        .to(grad.dtype)


# --- scatter reductions ----------------------------------------------------------------------

#: Largest (source elements x target elements) comparison a dense scatter_reduce may build.
_DENSE_SCATTER_LIMIT = 1 << 22


@decomposition(aten.index_copy.default)
def index_copy_one_position(x, dim, index, source):
    # A static KV cache's decode step writes one position along the sequence dim
    # (transformers' StaticCache: cache.index_copy_(2, cache_position, new)). torch's
    # decomposition is an index_put with None gaps, lowered as a scatter giving every element
    # its own index, which XLA CPU runs as a loop of one iteration per element (128 per cache
    # of the tiny GPT-2 of bench/generation.py, four caches a step). One position is a compare
    # and a select over the cache, fused into one loop. A negative index counts from the end,
    # as the scatter's (torch's index_fill decomposes through index_copy with the index it was
    # given; eager's index_copy itself refuses one, index_checks.py's check before this); one
    # out of range matches no position and writes nothing, as the scatter.
    if x.dim() == 0 or index.dim() != 1 or source.dim() != x.dim() or \
            not guard_or_false(index.shape[0] == 1):
        return torch_decomposition(aten.index_copy.default)(x, dim, index, source)
    dim = dim % x.dim()
    size = x.shape[dim]
    index = torch.where(index < 0, index + size, index).reshape([1] * x.dim())
    return torch.where(_positions_along(x, dim) == index, source, x)


def _positions_along(x, dim: int):
    """Each position's coordinate along ``dim`` (0 .. size - 1), shaped to broadcast against
    ``x``: compared with an index, the positions a one-position write selects."""
    positions = torch.arange(x.shape[dim], device=x.device)
    return positions.reshape([-1 if d == dim else 1 for d in range(x.dim())])


@decomposition(aten.scatter_reduce.two)
def scatter_reduce(self, dim, index, src, reduce, include_self=True):
    # torch-mlir leaves it unlowered. Each source element goes to a flat position of self; sum
    # and mean are accumulating scatters (index_put), which scale. amax, amin and prod have no
    # accumulating scatter to lower to: every source element is compared with every target
    # position, a dense (K x N) table bounded by _DENSE_SCATTER_LIMIT (beyond it: the host).
    if self.dtype == torch.bool:
        return NotImplemented
    if self.dim() == 0:  # a 0-dim self is one slot of a 1-element dim
        return scatter_reduce(self.reshape(1), 0, index.reshape(-1), src.reshape(-1), reduce,
                              include_self).reshape(())
    dim = dim % self.dim()
    src = src[tuple(slice(0, n) for n in index.shape)]  # src may be larger than index
    if index.numel() == 0:
        return self.clone()
    flat = _flat_positions(self.shape, dim, index)
    values = src.reshape(-1)
    n = self.numel()
    target = self.reshape(-1)
    count = torch.zeros(n, dtype=torch.int64).index_put((flat,), torch.ones_like(flat), True)
    hit = count > 0
    if reduce in ("sum", "mean"):
        # Half-width floats accumulate in float32, as the CPU kernel (a bf16 sum of a
        # thousand ones stalls at 512).
        compute = computing_dtype(self.dtype)
        total = torch.zeros(n, dtype=compute).index_put((flat,), values.to(compute), True)
        if include_self:
            total, count = total + target.to(compute), count + 1
        total = total.to(self.dtype)  # the mean divides the rounded sum by a rounded count
        if reduce == "mean":
            divisor = count.clamp(min=1).to(total.dtype)
            total = total / divisor if total.is_floating_point() else \
                torch.div(total, divisor, rounding_mode="floor")
        return torch.where(hit, total, target).reshape(self.shape)
    if flat.numel() * n > _DENSE_SCATTER_LIMIT:
        return NotImplemented
    mask = flat[:, None] == torch.arange(n)[None, :]
    column = values[:, None]
    if reduce == "prod":
        out = torch.where(mask, column, torch.ones_like(column)).prod(0)
        out = out * target if include_self else out
    else:
        info = torch.finfo if self.is_floating_point() else torch.iinfo
        fill = info(self.dtype).min if reduce == "amax" else info(self.dtype).max
        if self.is_floating_point():
            fill = float("-inf") if reduce == "amax" else float("inf")
        filled = torch.where(mask, column, torch.full_like(column, fill))
        out = filled.amax(0) if reduce == "amax" else filled.amin(0)
        if include_self:
            out = torch.maximum(out, target) if reduce == "amax" else torch.minimum(out, target)
    return torch.where(hit, out.to(self.dtype), target).reshape(self.shape)


_SEGMENT_SCATTER = {"sum": "sum", "mean": "sum", "max": "amax", "min": "amin", "prod": "prod"}


@decomposition(aten.segment_reduce.default)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0,
                   unsafe=False, initial=None):
    # Unlowered. Each position along ``axis`` from the first segment's start to the last's
    # end belongs to the segment whose end is the first past it; the others (before offsets
    # that do not start at 0, after lengths that do not reach the end under unsafe=True)
    # belong to none: a scatter_reduce into the segments and one spare, dropped. Then eager's
    # values for empty segments (sum 0, prod 1, mean NaN, max -inf, min inf) or ``initial``,
    # which also joins every segment's reduction. Eager's data checks are index_checks'.
    if indices is not None or reduce not in _SEGMENT_SCATTER:
        return NotImplemented
    axis = axis % data.dim()
    if lengths is None:
        segments = offsets.shape[-1] - 1
        count = offsets.narrow(-1, 1, segments) - offsets.narrow(-1, 0, segments)
        first, ends = offsets.narrow(-1, 0, 1), offsets.narrow(-1, 1, segments)
    else:
        segments, count = lengths.shape[-1], lengths
        first, ends = torch.zeros_like(lengths.narrow(-1, 0, 1)), torch.cumsum(lengths, -1)
    length = data.shape[axis]
    out_shape = list(data.shape[:axis]) + [segments] + list(data.shape[axis + 1:])
    if segments == 0:
        return data.new_zeros(out_shape)
    position = torch.arange(length)
    segment = (ends.unsqueeze(-1) <= position).sum(-2)     # lead + [length]
    outside = (position < first) | (position >= ends.narrow(-1, segments - 1, 1))
    segment = torch.where(outside, segments, segment)
    trailing = [1] * (data.dim() - axis - 1)
    index = segment.reshape(list(segment.shape) + trailing).expand(data.shape)
    spare = list(out_shape)
    spare[axis] += 1
    out = data.new_zeros(spare).scatter_reduce(axis, index, data, _SEGMENT_SCATTER[reduce],
                                               include_self=False).narrow(axis, 0, segments)
    count = count.reshape(list(count.shape) + trailing)
    empty = count == 0
    if initial is not None:
        if reduce in ("sum", "mean"):
            out = out + initial
        elif reduce == "prod":
            out = out * initial
        else:
            limit = torch.full_like(out, initial)
            out = torch.maximum(out, limit) if reduce == "max" else torch.minimum(out, limit)
        if reduce == "mean":
            out = out / count.clamp(min=1)
        return torch.where(empty, torch.full_like(out, initial), out)
    if reduce == "mean":
        return out / count   # 0 / 0: NaN for an empty segment, as eager
    fill = {"sum": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf")}[reduce]
    return torch.where(empty, torch.full_like(out, fill), out)


@decomposition(aten.gather.default)
def gather_of_a_0d_tensor(self, dim, index, sparse_grad=False):
    # torch-mlir fails to legalize a 0-d gather (it ran on the host): the same over [1].
    if self.dim() != 0 or not guard_or_false(index.numel() == 1):
        return NotImplemented
    return self.reshape(1).gather(0, index.reshape(1)).reshape(index.shape)


@decomposition(aten.scatter_add.default)
def scatter_add(self, dim, index, src):
    # torch-mlir lowers it, accumulating in the tensor's dtype; the CPU kernel sums half-width
    # floats in float32 (a bf16 sum of a thousand ones gave 512).
    # A 0-d scatter (torch-mlir fails to legalize one) is the same over [1] tensors.
    if self.dim() == 0:
        return self.reshape(1).scatter_add(0, index.reshape(1), src.reshape(1)).reshape(())
    compute = computing_dtype(self.dtype)
    if compute == self.dtype:
        return NotImplemented
    return self.to(compute).scatter_add(dim, index, src.to(compute)).to(self.dtype)


@decomposition(aten.scatter.value, aten.scatter.src)
def scatter_one_per_row(self, dim, index, src):
    # An index with one entry per row along ``dim`` and self's extent elsewhere (a one-hot:
    # nll_loss's backward, so every language model's cross entropy) writes where the row's
    # position equals its index: a compare and a select, which XLA fuses into what reads the
    # result. As a scatter, the (tokens x vocabulary) result was a buffer of its own in every
    # training step's backward (200 MB of GPT-2's batch of 4 x 256); the log-softmax
    # backward's sum of it is fx_passes.sum_of_one_hot_product's. An index out of range
    # writes nothing, as XLA's scatter (its check is index_checks.py's, made before).
    rank = self.dim()
    if rank == 0 and guard_or_false(index.numel() == 1):  # as over [1] tensors: torch-mlir
        # fails to legalize a 0-d scatter
        src = src.reshape(1) if isinstance(src, torch.Tensor) else src
        return self.reshape(1).scatter(0, index.reshape(1), src).reshape(())
    if index.dim() != rank:
        return NotImplemented
    dim = dim % rank
    if not guard_or_false(index.shape[dim] == 1) or not all(
            guard_or_false(index.shape[d] == self.shape[d]) for d in range(rank) if d != dim):
        return NotImplemented
    if isinstance(src, torch.Tensor):
        src = src[tuple(slice(0, size) for size in index.shape)]
    else:  # scatter casts the value to self's dtype
        src = torch.scalar_tensor(src, dtype=self.dtype, device=self.device)
    return torch.where(_positions_along(self, dim) == index, src, self)


@decomposition(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_with_reduce(self, dim, index, src, reduce):
    # The older spelling of scatter_reduce ("add", "multiply"), also unlowered.
    if not isinstance(src, torch.Tensor):
        src = torch.full(index.shape, src, dtype=self.dtype)
    mode = {"add": "sum", "multiply": "prod"}.get(reduce)
    if mode is None:
        return NotImplemented
    return scatter_reduce(self, dim, index, src, mode, True)


@decomposition(aten.index_reduce.default)
def index_reduce(self, dim, index, source, reduce, include_self=True):
    # Unlowered; the same as scatter_reduce with ``index`` spread over ``source``'s other dims.
    if self.dim() == 0:  # a 0-dim self is one slot of a 1-element dim
        return index_reduce(self.reshape(1), 0, index.reshape(-1), source.reshape(-1), reduce,
                            include_self).reshape(())
    dim = dim % self.dim()
    if guard_or_false(source.numel() == 0) and guard_or_false(index.numel() != 0):
        # No element to reduce (self's other dims are source's), but eager checks the index
        # all the same: the result reads it, or the scatter of nothing left its check
        # (index_checks.py) unused and tracing dropped it (a (2, 0) self returned).
        return self + index.sum().to(self.dtype)
    view = [1] * source.dim()
    view[dim] = index.numel()
    spread = index.to(torch.int64).reshape(view).expand(source.shape)
    return scatter_reduce(self, dim, spread, source, reduce, include_self)


def _flat_positions(shape, dim: int, index):
    """The flat position in a contiguous tensor of ``shape`` of each element of ``index``
    (scatter semantics: ``index`` gives the coordinate along ``dim``, its own position the
    others)."""
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    flat = torch.zeros(index.shape, dtype=torch.int64)
    for d in range(len(shape)):
        if d == dim:
            coord = index.to(torch.int64)
        else:
            view = [1] * index.dim()
            view[d] = index.shape[d]
            coord = torch.arange(index.shape[d]).reshape(view)
        flat = flat + coord * strides[d]
    return flat.reshape(-1)
