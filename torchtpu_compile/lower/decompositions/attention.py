"""Attention's fused inference kernels: what nn.MultiheadAttention and nn.TransformerEncoderLayer
call in eval mode under ``no_grad`` (their "fast path", taken on the tpu device as on CUDA), and
the masked softmax they share.

Without these, such a layer ran whole on the host: on the eager device an upload and a download
per layer, and under ``torch.compile`` the whole encoder layer as one host op in the graph. The
semantics follow the CPU kernels (aten/src/ATen/native/transformers/attention.cpp,
transformer.cpp and SoftMax.cpp), which are the reference here:

- A mask is a boolean "masked out" mask. A float mask is made boolean first, as the kernels do:
  every nonzero entry masks (``-inf`` and ``0.5`` alike), unlike the additive float masks of the
  layers' slow path.
- ``mask_type`` 0 is an (L, L) attention mask, 1 a (B, L) key padding mask, 2 a mask of the
  scores' own shape; a mask that is not 2-D, or scores that are not 4-D, are type 2.
- A row whose every key is masked gives NaN (0 / 0), as on the CPU.

Example::

    table = decomposition_table()
    out, weights = table[torch.ops.aten._native_multi_head_attention.default](
        x, x, x, 16, 4, in_proj_weight, in_proj_bias, out_proj_weight, out_proj_bias)
"""
from __future__ import annotations

import math
import struct

import torch
import torch.nn.functional as F

from ...errors import invalid_input
from .registry import decomposition

aten = torch.ops.aten


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise invalid_input(RuntimeError, message)


def _broadcast_mask(scores, mask, mask_type):
    """``mask`` in a shape that broadcasts against ``scores``, after the CPU kernel's checks."""
    _require(mask.dtype == torch.bool, "Mask should be a boolean tensor")
    if mask.dim() != 2 or scores.dim() != 4:
        mask_type = 2
    if mask_type == 2:
        _require(scores.shape == mask.shape,
                 "For mask_type == 2 mask shape should match input shape")
        return mask
    if mask_type == 1:
        _require(scores.shape[0] == mask.shape[0] and scores.shape[2] == mask.shape[1],
                 "For mask_type == 1 mask shape should be (B, L)")
        return mask.view(mask.shape[0], 1, 1, mask.shape[1])
    if mask_type == 0:
        _require(scores.shape[2] == mask.shape[0] and scores.shape[2] == mask.shape[1],
                 "For mask_type == 0 mask shape should be (L, L)")
        return mask.view(1, 1, *mask.shape)
    return None


def causal_mask_merged(query, key, attn_mask, is_causal):
    """(mask, is_causal) for attention given both a mask and ``is_causal``, as eager's CPU
    kernel takes them: the mask and the top-left causal mask together (a bool mask and'ed,
    a float one with -inf where causal masks), then no causal flag. The math formulation,
    which the device and the compile path run, refused the pair.

    Example::

        mask, causal = causal_mask_merged(q, k, padding_mask, True)   # causal is False
    """
    if attn_mask is None or not is_causal:
        return attn_mask, is_causal
    length, source = query.shape[-2], key.shape[-2]
    causal = torch.ones(length, source, dtype=torch.bool, device=query.device).tril()
    if attn_mask.dtype == torch.bool:
        return attn_mask & causal, False
    return attn_mask.masked_fill(~causal, float("-inf")), False


@decomposition(aten._masked_softmax.default)
def masked_softmax(scores, mask, dim=None, mask_type=None):
    broadcast = _broadcast_mask(scores, mask, mask_type)
    if broadcast is None:
        # A 2-D mask on 4-D scores without a type: the CPU kernel's reading of it is its own.
        return NotImplemented
    dim = scores.dim() - 1 if dim is None else dim
    # A fully masked row is all -inf: exp(-inf - -inf) / sum is NaN, the CPU kernel's 0 / 0.
    return torch.softmax(scores.masked_fill(broadcast, float("-inf")), dim)


@decomposition(aten._masked_softmax_backward.default)
def masked_softmax_backward(grad, output, mask, dim=None):
    _require(grad.shape == mask.shape, "Mask shape should match grad shape")
    _require(mask.dtype == torch.bool, "Mask should be a boolean tensor")
    dim = output.dim() - 1 if dim is None else dim
    # Masked entries take no part: the kernel skips them in the sum and writes 0 there.
    output = output.masked_fill(mask, 0)
    grad = grad.masked_fill(mask, 0)
    return output * (grad - (grad * output).sum(dim, keepdim=True))


@decomposition(aten._transform_bias_rescale_qkv.default)
def transform_bias_rescale_qkv(qkv, qkv_bias, num_heads):
    batch, length, three_dims = qkv.shape
    dims = three_dims // 3
    _require(dims % num_heads == 0, "Expected D % num_head == 0 to be true, but got false.")
    _require(three_dims % 3 == 0, "Expected _3D % 3 == 0 to be true, but got false.")
    head_dims = dims // num_heads
    # The kernel takes the square root and its inverse in the tensors' dtype, then scales q.
    scale = _rounded(1.0 / _rounded(math.sqrt(head_dims), qkv.dtype), qkv.dtype)
    q, k, v = (qkv + qkv_bias).view(batch, length, 3, num_heads, head_dims) \
        .permute(2, 0, 3, 1, 4).unbind(0)
    return q * scale, k.contiguous(), v.contiguous()


def _rounded(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to ``dtype`` (to nearest, ties to even), on the host: a tensor made for
    it while tracing would be a fake one, whose value cannot be read."""
    if dtype == torch.float64:
        return value
    if dtype == torch.float16:
        return struct.unpack("e", struct.pack("e", value))[0]
    single = struct.unpack("f", struct.pack("f", value))[0]
    if dtype != torch.bfloat16:
        return single
    bits = struct.unpack("I", struct.pack("f", single))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return struct.unpack("f", struct.pack("I", bits))[0]


def _check_attention_inputs(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias):
    _require(query.dim() == 3, f"expected 3-D `query`, got {query.dim()}-D tensor")
    _require(query.shape[2] == embed_dim,
             f"passed-in embed_dim {embed_dim} didn't match last dim of query {query.shape[2]}")
    _require(key.dim() == 3, f"expected 3-D `key`, got {key.dim()}-D tensor")
    _require(value.dim() == 3, f"expected 3-D `value`, got {value.dim()}-D tensor")
    _require(query.shape == key.shape == value.shape,
             "expected `query`/`key`/`value` shapes to match")
    _require(qkv_weight.dim() == 2, f"expected 2-D `qkv_weight`, got {qkv_weight.dim()}-D tensor")
    _require(qkv_weight.shape[0] == 3 * embed_dim,
             "expected `qkv_weight` first dim to be 3x embed_dim")
    _require(qkv_weight.shape[1] == embed_dim,
             "expected `qkv_weight` second dim to be embed_Dim")
    _require(qkv_bias.dim() == 1, f"expected 1-D `qkv_bias`, got {qkv_bias.dim()}-D tensor")
    _require(qkv_bias.shape[0] == 3 * embed_dim,
             "expected `qkv_bias` first dim and first dim of query to be equal")
    _require(embed_dim % num_head == 0, "`embed_dim` must divide evenly by `num_heads`")


def _qkv_projection(query, key, value, embed_dim, qkv_weight):
    # One matmul for self-attention, as the kernel; each output element is the same dot product
    # either way.
    if query is key and key is value:
        return torch.matmul(query, qkv_weight.t())
    if key is value:
        q_weight, kv_weight = qkv_weight.split([embed_dim, 2 * embed_dim])
        return torch.cat([torch.matmul(query, q_weight.t()), torch.matmul(key, kv_weight.t())], 2)
    q_weight, k_weight, v_weight = qkv_weight.chunk(3)
    return torch.cat([torch.matmul(query, q_weight.t()), torch.matmul(key, k_weight.t()),
                      torch.matmul(value, v_weight.t())], 2)


@decomposition(aten._native_multi_head_attention.default)
def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias,
                                proj_weight, proj_bias, mask=None, need_weights=True,
                                average_attn_weights=True, mask_type=None):
    _check_attention_inputs(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias)
    qkv = _qkv_projection(query, key, value, embed_dim, qkv_weight)
    if qkv.numel() == 0:
        return torch.empty_like(query), None
    q, k, v = aten._transform_bias_rescale_qkv(qkv, qkv_bias, num_head)
    scores = torch.matmul(q, k.transpose(2, 3))
    if mask is None:
        weights = torch.softmax(scores, -1)
    else:
        weights = aten._masked_softmax(scores, mask.to(torch.bool), 3, mask_type)
    batch, heads, length, head_dims = q.shape
    context = torch.matmul(weights, v).transpose(1, 2).reshape(batch, length, heads * head_dims)
    out = F.linear(context, proj_weight, proj_bias)
    if not need_weights:
        return out, None
    if average_attn_weights:
        weights = weights.sum(1) / num_head
    return out, weights


@decomposition(aten._transformer_encoder_layer_fwd.default)
def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                  proj_bias, use_gelu, norm_first, eps, norm_weight_1,
                                  norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1,
                                  ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                  mask_type=None):
    if src.numel() == 0:
        return src.clone()

    def norm(x, weight, bias):
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = aten._native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias,
                                          proj_weight, proj_bias, mask, False, True,
                                          mask_type)[0] + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
    hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
    x = F.linear(hidden, ffn_weight_2, ffn_bias_2) + residual
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)
