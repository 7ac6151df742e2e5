"""Losses whose reference decomposition differs from eager: multilabel margin loss.

Example::

    table = decomposition_table()
    table[torch.ops.aten.multilabel_margin_loss_forward.default](x, target, 1)
"""
from __future__ import annotations

import torch

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


def install_above_autograd() -> None:
    """Put ours in place of PyTorch's reference where torch.compile meets it first.

    PyTorch registers its reference as the op's Python-dispatcher kernel at the Autograd key
    (``py_impl(DispatchKey.Autograd)``): Dynamo and aot_autograd trace with the Python
    dispatcher on, so it runs above autograd, before any decomposition table sees the op, and
    its wrong values and shapes would reach every compiled graph. Called when the backend is
    imported, before Dynamo traces a frame.
    """
    op = aten.multilabel_margin_loss_forward.default
    op.py_kernels[torch._C.DispatchKey.Autograd] = multilabel_margin_loss_forward
    op._dispatch_cache.clear()
