"""Views and copies of views, as reshapes, slices, gathers and concatenations: torch-mlir lowers
several through constants XLA rejects (as_strided's dense_resource index; the
torch.constant.int that diagonal and unfold leave behind) or builds a wrong concatenate (roll).

Example::

    table = decomposition_table()
    table[torch.ops.aten.roll.default](torch.arange(4), [1])   # [3, 0, 1, 2]
"""
from __future__ import annotations

import torch

from .common import has_symbolic_size
from .jax_functions import builds, jax_function
from .registry import decomposition

aten = torch.ops.aten


# --- reinterpreted bits ----------------------------------------------------------------------

@builds("bitcast")
def _bitcast_fn(dtype: str):
    import jax
    import jax.numpy as jnp

    def bitcast(x):
        # lax's bitcast between widths adds (narrowing) or drops (widening) a last dim of the
        # width ratio; torch's view(dtype) scales its last dim instead. The barrier keeps XLA
        # from merging two such bitcasts in one program (u8 -> f32 -> s16, a fused recording
        # of writes through views of two dtypes) into one its verifier rejects.
        x = jax.lax.optimization_barrier(x)
        if jnp.dtype(dtype).itemsize < x.dtype.itemsize:
            out = jax.lax.bitcast_convert_type(x, dtype)
            return out.reshape(*x.shape[:-1], -1)
        ratio = jnp.dtype(dtype).itemsize // x.dtype.itemsize
        return jax.lax.bitcast_convert_type(x.reshape(*x.shape[:-1], -1, ratio), dtype)
    return bitcast


@decomposition(aten.view.dtype)
def view_dtype(x, dtype):
    # torch-mlir lowers view(dtype) between types of one width only, and to bool as if it were
    # one bit wide; safetensors loads each tensor as bytes on the device and views them as its
    # dtype (load_file(device=0)). A bool is a byte holding 0 or 1.
    if x.dim() == 0 or x.dtype == dtype:
        return NotImplemented   # eager's error for a 0-d tensor of another width; an alias
    if x.dtype == torch.bool:
        return x.to(torch.uint8).view(dtype)
    if dtype == torch.bool:
        return x.view(torch.uint8) != 0
    if torch.empty((), dtype=dtype).element_size() == x.element_size():
        return NotImplemented
    return jax_function("bitcast", str(dtype).removeprefix("torch."))(x.contiguous())


@decomposition(aten._neg_view.default)
def neg_view(x):
    # The negative bit's view, as a value (a functional graph has no views): the backward of
    # a complex conj().imag has one of its real parts, which torch-mlir does not lower.
    if x.dtype == torch.complex128:
        return NotImplemented
    return aten.neg.default(x)


# --- copies of views -------------------------------------------------------------------------

@decomposition(aten.view_copy.default)
def view_copy(x, size):
    return x.reshape(size).clone()


@decomposition(aten.unbind_copy.int)
def unbind_copy(x, dim=0):
    return [t.clone() for t in torch.unbind(x, dim)]


@decomposition(aten.narrow_copy.default)
def narrow_copy(x, dim, start, length):
    return x.narrow(dim, start, length).clone()


@decomposition(aten.permute_copy.default)
def permute_copy(x, dims):
    return x.permute(dims).clone()


# --- strided views: a reshape, or a gather of the flat storage -------------------------------

def _contiguous_strides(size) -> list:
    strides, step = [], 1
    for s in reversed(list(size)):
        strides.append(step)
        step *= max(s, 1)
    return strides[::-1]


@decomposition(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(x, size, stride, storage_offset=None):
    # torch-mlir lowers as_strided through a dense_resource index constant, which XLA rejects
    # ("Only dense elements attr are supported"); group_norm's decomposition emits it. On a
    # contiguous input it is a reshape, or a gather at indices computed in the graph. The
    # graph holds x's elements only, from x's own first one: positions count from there (an
    # input with a storage offset, x[1:]: fuzz seed 4099, XLA's error), and a view reaching
    # outside them (into storage the graph does not hold) is not decomposed. A permuted x
    # whose elements fill a block of its storage is read in the storage's order first
    # (Longformer's and LED's overlapping chunks of a transposed projection).
    base = x.storage_offset()
    flat = _in_storage_order(x) if isinstance(base, int) else None
    if flat is None:
        return NotImplemented
    if not isinstance(storage_offset, (int, type(None))) or \
            not all(isinstance(v, int) for v in (*size, *stride)):
        # A symbolic geometry (aot_autograd views overlapping inputs of a dynamic graph from
        # one synthetic base) has no proxy of its own in this trace: used as a value, make_fx
        # looped until Python's recursion limit. aten.as_strided takes it as it is.
        return NotImplemented
    offset = (base if storage_offset is None else storage_offset) - base
    size, stride = list(size), list(stride)
    count = 1
    for s in size:
        count *= s
    if count and not 0 <= offset + sum(min(st * (s - 1), 0) for s, st in zip(size, stride)) \
            <= offset + sum(max(st * (s - 1), 0) for s, st in zip(size, stride)) < x.numel():
        return NotImplemented
    if offset == 0 and count == x.numel() and all(
            st == cs for s, st, cs in zip(size, stride, _contiguous_strides(size)) if s > 1):
        return flat.reshape(size).clone()
    return flat[_strided_index(size, stride, offset)]


def _in_storage_order(x):
    """``x``'s elements flat, in the order of its storage, where they fill a block of it with
    no gap or overlap (``x`` contiguous, or a permutation of a contiguous tensor); else None.
    """
    if not all(isinstance(v, int) for v in (*x.shape, *x.stride())):
        return None
    walked = sorted((d for d in range(x.dim()) if x.shape[d] != 1), key=x.stride, reverse=True)
    expected = 1
    for d in reversed(walked):
        if x.stride(d) != expected:
            return None
        expected *= x.shape[d]
    if walked == sorted(walked):
        return x.reshape(-1)
    return x.permute(walked + [d for d in range(x.dim()) if d not in walked]).reshape(-1)


def _strided_index(size, stride, offset):
    """Flat storage positions of the elements of an as_strided(size, stride, offset) view."""
    index = torch.full([1] * len(size), offset, dtype=torch.int64)
    for d, (s, st) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = s
        index = index + torch.arange(s, dtype=torch.int64).view(shape) * st
    return index.expand(list(size))


@decomposition(aten.as_strided_scatter.default)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    # No lowering (Swin's window partition backward). On a contiguous input: a scatter of
    # ``src`` into the flat storage at the view's positions.
    if not x.is_contiguous() or x.storage_offset() != 0:
        return NotImplemented
    index = _strided_index(list(size), list(stride), storage_offset or 0)
    flat = x.reshape(-1).scatter(0, index.reshape(-1), src.reshape(-1).to(x.dtype))
    return flat.reshape(x.shape)


# --- diagonals: strided slices of the flattened last two dims --------------------------------

def _diagonal_slice(x, offset, dim1, dim2):
    """(x with dim1, dim2 moved last and flattened, start, end, step, length) of the diagonal."""
    moved = torch.movedim(x, (dim1 % x.dim(), dim2 % x.dim()), (-2, -1))
    n, m = moved.shape[-2], moved.shape[-1]
    if offset >= 0:
        length, start = max(min(n, m - offset), 0), offset
    else:
        length, start = max(min(n + offset, m), 0), -offset * m
    flat = moved.reshape(list(moved.shape[:-2]) + [n * m])
    end = start + (length - 1) * (m + 1) + 1 if length else start
    return moved, flat, start, end, m + 1, length


@decomposition(aten.diagonal.default)
def diagonal(x, offset=0, dim1=0, dim2=1):
    # torch-mlir leaves a torch.constant.int behind for diagonal (and diag, diagonal_copy).
    # Whole at symbolic sizes: a bucket's rule takes the padded diagonal (buckets/rules.py).
    if has_symbolic_size(x):
        return NotImplemented
    moved, flat, start, end, step, length = _diagonal_slice(x, offset, dim1, dim2)
    if length == 0:
        return flat.new_zeros(list(moved.shape[:-2]) + [0])
    return aten.slice.Tensor(flat, -1, start, end, step)


@decomposition(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    if has_symbolic_size(x):
        return NotImplemented
    moved, flat, start, end, step, length = _diagonal_slice(x, offset, dim1, dim2)
    if length == 0:
        return x.clone()
    flat = aten.slice_scatter.default(flat, src, -1, start, end, step)
    return torch.movedim(flat.reshape(moved.shape), (-2, -1), (dim1 % x.dim(), dim2 % x.dim()))


# --- windows and rolls -----------------------------------------------------------------------

@decomposition(aten.unfold.default)
def unfold(x, dimension, size, step):
    # torch-mlir leaves a torch.constant.int behind. The windows as slices, stacked on dim
    # ``dimension``, their elements last, as eager lays them out.
    if x.dim() == 0:
        return x.reshape(1)
    dimension %= x.dim()
    count = (x.shape[dimension] - size) // step + 1
    windows = [x.narrow(dimension, i * step, size) for i in range(count)]
    return torch.stack(windows, dimension).movedim(dimension + 1, -1)


@decomposition(aten.roll.default)
def roll(x, shifts, dims=()):
    # torch-mlir's roll builds a concatenate of the wrong size for some shifts (|shift| > 1 on
    # a 3-d input). Two slices and a concatenate per rolled dim.
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims:
        return roll(x.flatten(), shifts, [0]).reshape(x.shape)
    out = x.clone()  # a roll by zero is still a new tensor
    for shift, dim in zip(shifts, dims):
        n = out.shape[dim]
        if isinstance(n, torch.SymInt):
            # A dynamic size: slices of lengths ``shift % n`` and ``n - shift % n`` have no
            # bound at a bucket's padded size (7 % 8 is 7 but 7 % 5 is 2), and a padded roll
            # dropped real elements. Gather from the rolled positions instead.
            index = torch.remainder(torch.arange(n, device=x.device) - shift, n)
            out = out.index_select(dim, index)
            continue
        shift = shift % n if n else 0
        if shift:
            out = torch.cat([out.narrow(dim, n - shift, shift), out.narrow(dim, 0, n - shift)], dim)
    return out


@decomposition(aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
               aten.replication_pad3d_backward.default)
def replication_pad_backward(grad, x, padding):
    """Replication padding reads input position clamp(i - left, 0, n - 1) along each padded
    dim, one dim at a time: its gradient adds each dim's back into place, in reverse order
    (torch-mlir does not lower these backwards: nn.ReplicationPad*d trained in eager PyTorch).
    """
    for i in range(len(padding) // 2):  # (left, right) pairs from the last dim
        axis = grad.dim() - 1 - i
        left, right, n = padding[2 * i], padding[2 * i + 1], x.shape[axis]
        index = torch.arange(-left, n + right).clamp(0, n - 1)
        shape = list(grad.shape)
        shape[axis] = n
        grad = torch.zeros(shape, dtype=grad.dtype).index_add(axis, index, grad)
    return grad
