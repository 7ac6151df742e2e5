"""Nested tensors on the tpu device as far as ``nn.TransformerEncoder``'s fast path uses them.

In eval mode under ``torch.no_grad()`` with a ``src_key_padding_mask``, ``nn.TransformerEncoder``
packs its input into a nested tensor (``torch._nested_tensor_from_mask``), runs each layer's
``torch._transformer_encoder_layer_fwd`` on it and unpacks it (``to_padded_tensor(0.0, size)``):
its output is zero at the padded positions. On the tpu device that nested tensor is a
``PaddedNested``: the padded values and each sequence's length. A layer runs on the padded
values with the padding masked out of attention (the values of every kept position are those
of the sequence run alone, as a nested tensor's are), and unpacking writes the padding value
over the padded positions. Any other op on it raises, naming the op.

Example::

    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, batch_first=True), 2)
    enc = enc.eval().to("tpu")
    with torch.no_grad():
        y = enc(x.to("tpu"), src_key_padding_mask=pad.to("tpu"))   # zeros where pad is True
"""
from __future__ import annotations

import torch

from . import fallback
from .dispatch import handles
from .tensor import TpuTensor

aten = torch.ops.aten


class PaddedNested(torch.Tensor):
    """A batch of sequences of different lengths on the tpu device: ``padded`` (B, S, E), the
    first ``lengths[b]`` rows of batch ``b`` being its sequence. Made by
    ``torch._nested_tensor_from_mask`` on tpu tensors, not directly."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, padded: torch.Tensor, lengths: torch.Tensor):
        t = torch.Tensor._make_wrapper_subclass(cls, padded.shape, dtype=padded.dtype,
                                                device=padded.device)
        t.padded = padded
        t.lengths = lengths
        return t

    def kept(self) -> torch.Tensor:
        """(B, S) bool: True at the positions that belong to a sequence."""
        positions = torch.arange(self.padded.shape[1], device=self.padded.device)
        return positions < self.lengths[:, None]

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        rule = _RULES.get(func)
        if rule is None:
            raise NotImplementedError(
                f"{func}: nested tensors on the tpu device support only nn.TransformerEncoder's "
                f"fast path (_transformer_encoder_layer_fwd, to_padded_tensor). Use a padded "
                f"tensor with a mask instead.")
        return rule(*args, **(kwargs or {}))

    def __repr__(self, *, tensor_contents=None):
        return f"PaddedNested(lengths={self.lengths.tolist()}, padded={self.padded!r})"


_RULES: dict = {}


def _rule(*ops):
    def register(fn):
        for op in ops:
            _RULES[op] = fn
        return fn
    return register


@handles(aten._nested_tensor_from_mask.default)
def from_mask(func, args, kwargs):
    """``torch._nested_tensor_from_mask(t, mask)``: sequence ``b`` is the first
    ``mask[b].sum()`` rows of ``t[b]``, as eager CPU takes them (a mask with gaps is refused
    unless ``mask_check=False``)."""
    bound = func._schema.arguments
    values = dict(zip((a.name for a in bound), args)) | kwargs
    t, mask, check = values["t"], values["mask"], values.get("mask_check", True)
    well_formed = (type(t) is TpuTensor and type(mask) is TpuTensor and t.dim() == 3
                   and mask.dtype == torch.bool and tuple(mask.shape) == tuple(t.shape[:2]))
    if not well_formed or (check and not torch._nested_tensor_from_mask_left_aligned(t, mask)):
        fallback.raise_eagers_error(func, args, kwargs)
        raise NotImplementedError(f"{func}: takes a 3-d tpu tensor and a bool (B, S) tpu mask")
    return PaddedNested(t, mask.sum(1))


@_rule(aten._transformer_encoder_layer_fwd.default)
def encoder_layer(src, *rest, mask=None, mask_type=None):
    # The layer's Python code passes no mask with a nested input: the lengths are the mask.
    weights, mask = rest[:17], rest[17] if len(rest) > 17 else mask
    if mask is not None:
        raise NotImplementedError(
            "aten._transformer_encoder_layer_fwd: a nested input with a mask is not supported "
            "on the tpu device (eager CPU refuses it too)")
    padded = src.padded
    pad = torch.zeros(padded.shape[:2], dtype=padded.dtype, device=padded.device)
    pad = pad.masked_fill(src.kept().logical_not(), float("-inf"))
    out = torch._transformer_encoder_layer_fwd(padded, *weights, pad, 1)
    return PaddedNested(out, src.lengths)


@_rule(aten.to_padded_tensor.default)
def to_padded_tensor(nested, padding, output_size=None):
    padded = nested.padded
    longest = (padded.shape[1] if output_size is not None and output_size[1] >= padded.shape[1]
               else int(nested.lengths.max()) if nested.lengths.numel() else 0)
    need = (padded.shape[0], longest, padded.shape[2])
    size = need if output_size is None else tuple(output_size)
    if len(size) != 3 or any(s < n for s, n in zip(size, need)):
        host = torch._nested_tensor_from_mask(padded.cpu(), nested.kept().cpu(), mask_check=False)
        host.to_padded_tensor(padding, output_size)  # eager's error
        raise RuntimeError(f"to_padded_tensor: output_size {size} is smaller than {need}")
    out = torch.where(nested.kept()[..., None], padded, padding)[:, :size[1]]
    if size == tuple(out.shape):
        return out
    full = torch.full(size, padding, dtype=padded.dtype, device=padded.device)
    full[:out.shape[0], :out.shape[1], :out.shape[2]] = out
    return full
