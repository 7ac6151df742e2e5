"""Optimizers and ``clip_grad_norm_`` take their multi-tensor (``foreach``) path on tpu
tensors by default, as on CUDA.

PyTorch picks ``foreach=None``'s meaning per call: the ``_foreach_*`` ops when every tensor is
on a device that has them (CUDA, XPU, MTIA and the PrivateUse1 device, so "tpu") and its type
is exactly ``torch.Tensor`` or ``nn.Parameter`` (``torch.optim.optimizer`` and
``torch.utils._foreach_utils`` each keep that list of types). The tpu device's tensors are a
wrapper subclass, so every optimizer fell back to its per-parameter loop: SGD with momentum
dispatched three ops per parameter where CUDA dispatches three for the whole model, and
``clip_grad_norm_`` a norm per gradient. On the eager device each op is a dispatch (strict) or
a recorded entry (defer-and-fuse); the multi-tensor ops run as one program each.

Both lists gain the tpu tensor type, which no other device's tensors have: what CPU and CUDA
code picks is unchanged. ``foreach=False`` still selects the loop.

Example::

    model = torch.nn.Linear(4, 4).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt.defaults["foreach"]        # None; the step runs torch._foreach_add_ and friends
"""
from __future__ import annotations

import torch.optim.optimizer as _optimizer
import torch.utils._foreach_utils as _foreach_utils

#: The lists PyTorch reads ``type(t) in ...`` from when ``foreach`` is None.
_TYPE_LISTS = (_optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types)


def register() -> None:
    """Add the tpu tensor type to PyTorch's foreach-capable types (idempotent).

    Example::

        register()
        torch.optim.optimizer._default_to_fused_or_foreach(
            list(torch.nn.Linear(2, 2).to("tpu").parameters()), False)   # (False, True)
    """
    from .tensor import TpuTensor  # after the device is named "tpu" (it makes tpu devices)
    for types in _TYPE_LISTS:
        if TpuTensor not in types:
            types.append(TpuTensor)
