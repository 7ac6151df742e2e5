"""``F.scaled_dot_product_attention`` of jagged nested tensors (``layout=torch.jagged``) whose
values are on the tpu device.

PyTorch's jagged attention picks a kernel by device: CUDA's flash and memory-efficient kernels
take the jagged values as they are; on any other device it takes the math path, which splits
the values into a strided-layout nested tensor, a layout the tpu device does not hold. That
path's NotImplementedError was caught by the nested tensor's own dispatch, which then raised
"If inputs are nested tensors they must be contiguous". On tpu values the attention runs
instead on the batch padded to its longest sequence, with the keys past each sequence's end
masked out, and the queries' rows are gathered
back into the jagged layout: each sequence's result is what it gets alone, as with CPU's
math path. Every other device keeps PyTorch's function.

Example::

    nested = torch.nested.nested_tensor([a, b], layout=torch.jagged, device="tpu")  # (2, j, 16)
    q = nested.unflatten(-1, (2, 8)).transpose(1, 2)                              # (2, 2, j, 8)
    out = F.scaled_dot_product_attention(q, q, q)                                 # jagged
"""
from __future__ import annotations

import torch
import torch.nested._internal.ops as _jagged_ops

_pytorchs = _jagged_ops.jagged_scaled_dot_product_attention


def register() -> None:
    """Route jagged attention on tpu values through ``_padded_attention`` (idempotent).

    Example::

        register()
    """
    if _jagged_ops.jagged_scaled_dot_product_attention is _pytorchs:
        _jagged_ops.jagged_scaled_dot_product_attention = _attention


def _attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
               scale=None, enable_gqa=False):
    if is_causal or not _served(query, key, value, attn_mask):
        return _pytorchs(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                         is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    return _padded_attention(query, key, value, dropout_p, scale, enable_gqa)


def _served(query, key, value, attn_mask) -> bool:
    """Jagged (B, H, j, D) inputs on tpu, each its values whole (no lengths): others are
    PyTorch's, its errors (a mask, mismatched devices or dtypes; ``is_causal``, which CPU's
    math path refuses for jagged inputs) included."""
    from torch.nested._internal.nested_tensor import NestedTensor
    return (attn_mask is None
            and all(isinstance(t, NestedTensor) and t.device.type == "tpu" and t.dim() == 4
                    and t._ragged_idx == 2 and t._lengths is None
                    for t in (query, key, value))
            and query.dtype == key.dtype == value.dtype)


def _padded(nested):
    # (B, H, j, D) -> (B, H, longest, D), zeros past each sequence's end
    return nested.transpose(1, 2).to_padded_tensor(0.0).transpose(1, 2)


def _padded_attention(query, key, value, dropout_p, scale, enable_gqa):
    from torch.nested._internal.nested_tensor import nested_view_from_values_offsets
    q, k, v = _padded(query), _padded(key), _padded(value)
    key_offsets = key.transpose(1, 2).offsets()
    longest_q, longest_k = q.shape[2], k.shape[2]
    kept = torch.arange(longest_k, device=k.device) < key_offsets.diff()[:, None]   # (B, Lk)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=kept[:, None, None, :], dropout_p=dropout_p, scale=scale,
        enable_gqa=enable_gqa)
    # each query row's place in the padded result: (its sequence, its position there); a gather,
    # which autograd differentiates (aten._padded_dense_to_jagged_forward has no derivative)
    query_rows = query.transpose(1, 2)
    offsets = query_rows.offsets()
    rows = torch.arange(query_rows.values().shape[0], device=q.device)
    sequence = torch.searchsorted(offsets[1:], rows, right=True)
    place = sequence * longest_q + rows - offsets[sequence]
    padded_rows = out.transpose(1, 2).flatten(0, 1)                    # (B * Lq, H, D)
    values = padded_rows.index_select(0, place)
    return nested_view_from_values_offsets(
        values, offsets, min_seqlen=query._maybe_min_seqlen,
        max_seqlen=query._maybe_max_seqlen).transpose(1, 2)
