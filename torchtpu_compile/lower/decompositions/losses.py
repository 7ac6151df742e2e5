"""Losses whose reference decomposition differs from eager (the margin losses), or that
PyTorch computes in an opaque op (the chunked ``F.linear_cross_entropy``).

Example::

    table = decomposition_table()
    table[torch.ops.aten.multilabel_margin_loss_forward.default](x, target, 1)
"""
from __future__ import annotations

import importlib

import torch
from torch._decomp import decompositions as reference

from .registry import decomposition

aten = torch.ops.aten

_NONE, _MEAN = 0, 1


@decomposition(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(input, target, reduction):
    """sum over labels j (the target's entries before its first -1) and non-labels i of
    max(0, 1 - x[j] + x[i]) / dim, per row; and the is-target mask.

    PyTorch's reference (torch._decomp) counts the target slots after the first -1 as label 0
    (it gathers them at index 0 and never masks them), and keeps a 1-D input's unreduced loss
    1-D where eager returns a 0-d tensor.
    """
    shape = input.shape
    # A 0-d input is one row of one class (eager takes it); its last dim must not be empty.
    torch._check(input.dim() <= 2 and (input.dim() == 0 or input.shape[-1] != 0),
                 lambda: "Expected non-empty vector or matrix with optional 0-dim batch size, "
                         f"but got: {shape}")
    torch._check(target.dim() <= 2 and target.shape == shape,
                 lambda: f"inconsistent target size: {target.shape} for input of size: {shape}")
    x, t = torch.atleast_2d(input), torch.atleast_2d(target)
    dim = x.shape[1]
    idx = torch.arange(dim, device=t.device)
    end = torch.amin(torch.where(t == -1, idx, dim), dim=-1, keepdim=True)
    is_label = idx < end                                       # (n, j): slot j holds a label
    u = torch.gather(x, -1, torch.where(is_label, t, 0))       # (n, j): x at label j
    is_target = torch.any(idx == torch.where(is_label, t, -1).unsqueeze(-1), dim=1)  # (n, i)
    z = (1.0 - u.unsqueeze(-1) + x.unsqueeze(1)).clamp_min(0) / dim                  # (n, j, i)
    z = torch.where(is_label.unsqueeze(-1) & ~is_target.unsqueeze(1), z, 0)
    loss = z.sum(dim=(1, 2))
    if reduction == _MEAN:
        loss = loss.mean()
    elif reduction != _NONE:
        loss = loss.sum()
    elif input.dim() <= 1:
        loss = loss.reshape(())
    return loss, is_target.to(input.dtype).reshape(target.shape)


@decomposition(aten.multi_margin_loss.default)
def multi_margin_loss(input, target, p=1, margin=1, weight=None, reduction=_MEAN):
    """PyTorch's reference, with eager's shape for one sample given by a 0-d target: its
    unreduced loss is 0-d (the reference makes every unreduced loss 1-D).

    Example: ``multi_margin_loss(torch.randn(5), torch.tensor(2), reduction=0).shape == ()``.
    """
    loss = reference.multi_margin_loss(input, target, p, margin, weight, reduction)
    return loss.reshape(()) if reduction == _NONE and target.dim() == 0 else loss


class _LinearCrossEntropy:
    """The logits of ``input @ linear_weight.T + linear_bias`` in ``acc_dtype``, shifted by
    their row max, with each row's log-sum-exp, target column (0 where ignored) and class
    weight (1 without ``weight``; 0 where the target is ignored)."""

    def __init__(self, input, linear_weight, target, linear_bias, weight, ignore_index,
                 acc_dtype):
        self.linear_weight = linear_weight.to(acc_dtype)
        self.input = input.to(acc_dtype)
        logits = self.input @ self.linear_weight.t()
        if linear_bias is not None:
            logits = logits + linear_bias.to(acc_dtype)
        self.shifted = logits - logits.amax(dim=1, keepdim=True)
        self.log_denominator = torch.logsumexp(self.shifted, dim=1)
        ignored = target == ignore_index
        self.column = torch.where(ignored, 0, target)
        self.row_weight = (~ignored).to(acc_dtype) if weight is None else \
            torch.where(ignored, 0, weight.to(acc_dtype)[self.column])

    def losses(self, scale):
        """Each row's ``scale * (logsumexp - logit of the target)``."""
        target_logit = self.shifted.gather(1, self.column.unsqueeze(1)).squeeze(1)
        return scale * (self.log_denominator - target_logit)

    def grad(self, scale):
        """The logits' gradient: ``(softmax - one_hot(target)) * scale`` per row."""
        classes = torch.arange(self.shifted.shape[1], device=self.shifted.device)
        one_hot = (classes == self.column.unsqueeze(1)).to(self.shifted.dtype)
        softmax = torch.exp(self.shifted - self.log_denominator.unsqueeze(1))
        return (softmax - one_hot) * scale.unsqueeze(1)


# torch.nn registers the chunked ops when F.linear_cross_entropy first takes ``options``;
# importing their module registers them now, so the table holds them from the start.
importlib.import_module("torch.nn.modules.linear_cross_entropy")
torch_nn = torch.ops.torch_nn


@decomposition(torch_nn._linear_cross_entropy_batch_chunked.default)
def linear_cross_entropy_batch_chunked(input, linear_weight, target, linear_bias, weight,
                                       reduction, ignore_index, label_smoothing,
                                       batch_chunk_size, acc_policy, acc_dtype,
                                       allow_retain_graph, compute_input_grad,
                                       compute_linear_weight_grad, compute_linear_bias_grad):
    """``F.linear_cross_entropy(..., options=...)`` with a mean or sum: the loss and, where
    asked, its gradients for an upstream gradient of 1 (the op's backward scales them), in
    one pass: the logits' gradient is ``(softmax - one_hot) * w / d`` per row, read by the
    three gradients' matmuls.

    Eager's chunks (``batch_chunk_size``) bound its scratch memory; one XLA program holds
    the logits once as a temporary instead (XLA CPU computed every chunk's logits at once
    when the chunks were written out, so they bought nothing), and, as eager's op, saves
    nothing logits-sized for the backward. The math is done in ``acc_dtype`` and each
    result cast to the input's dtype, as eager's (``acc_policy`` picks eager's scratch
    buffers, not the values). A gradient not asked for is an empty tensor of eager's shape
    ((0, 0), or (0,) for the bias). A mean over rows that are all ignored, or over no rows,
    is NaN, as eager's.
    """
    parts = _LinearCrossEntropy(input, linear_weight, target, linear_bias, weight,
                                ignore_index, acc_dtype)
    if reduction == "mean":
        total = parts.row_weight.sum()
        scale = parts.row_weight / torch.where(total == 0, torch.nan, total)
    else:
        scale = parts.row_weight
    loss = parts.losses(scale).sum()
    if reduction == "mean" and input.shape[0] == 0:
        loss = torch.full_like(loss, torch.nan)
    dtype, empty = input.dtype, input.new_empty
    grad_input, grad_weight, grad_bias = empty((0, 0)), empty((0, 0)), empty((0,))
    if compute_input_grad or compute_linear_weight_grad or compute_linear_bias_grad:
        grad = parts.grad(scale)
        if compute_input_grad:
            grad_input = (grad @ parts.linear_weight).to(dtype)
        if compute_linear_weight_grad:
            grad_weight = (grad.t() @ parts.input).to(dtype)
        if compute_linear_bias_grad:
            grad_bias = grad.sum(0).to(dtype)
    return loss.to(dtype), grad_input, grad_weight, grad_bias


@decomposition(torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default)
def linear_cross_entropy_batch_chunked_no_reduction(input, linear_weight, target, linear_bias,
                                                    weight, ignore_index, batch_chunk_size,
                                                    acc_policy, acc_dtype):
    """``F.linear_cross_entropy(..., reduction="none", options=...)``: each row's
    ``w * (logsumexp - logit of the target)``, 0 where the target is ignored (the op's own
    backward recomputes the gradients)."""
    parts = _LinearCrossEntropy(input, linear_weight, target, linear_bias, weight,
                                ignore_index, acc_dtype)
    return parts.losses(parts.row_weight).to(input.dtype)


def install_above_autograd() -> None:
    """Put ours in place of PyTorch's reference where torch.compile meets it first.

    PyTorch registers its reference as the op's Python-dispatcher kernel at the Autograd key
    (``py_impl(DispatchKey.Autograd)``): Dynamo and aot_autograd trace with the Python
    dispatcher on, so it runs above autograd, before any decomposition table sees the op, and
    its wrong values and shapes would reach every compiled graph. Called when the backend is
    imported, before Dynamo traces a frame.
    """
    for op, ours in ((aten.multilabel_margin_loss_forward.default,
                      multilabel_margin_loss_forward),
                     (aten.multi_margin_loss.default, multi_margin_loss)):
        op.py_kernels[torch._C.DispatchKey.Autograd] = ours
        op._dispatch_cache.clear()
