"""Moving data between the host and the tpu device.

Uploads copy: a PJRT CPU buffer made through DLPack would alias the host tensor, and a later
in-place write on the host must not reach the device copy. Downloads copy for the same reason.

Example::

    t = from_cpu(torch.arange(3.0))     # a TpuTensor
    to_cpu(t)                           # tensor([0., 1., 2.])
"""
from __future__ import annotations

import torch

from torchtpu_compile import index_errors
from torchtpu_compile.runtime.client import get_client
from torchtpu_compile.runtime.transfer import to_buffer, to_torch

from . import modes, views
from .tensor import new_tensor


def upload(host: torch.Tensor):
    """A PJRT buffer holding a copy of host tensor ``host``."""
    # A conjugate or negative bit is a lazy flag, not values: a buffer holds the values.
    host = host.detach().resolve_conj().resolve_neg()
    if get_client().platform == "cpu":
        host = host.clone(memory_format=torch.contiguous_format)
    return to_buffer(host)


def download(buffer) -> torch.Tensor:
    """A host tensor holding a copy of a (concrete) PJRT buffer.

    A synchronization point: an index out of range found by an op that ran before is raised
    here (``torchtpu_compile.index_errors``), as CUDA raises a device-side assert at the next
    synchronization.
    """
    if index_errors.has_pending():
        index_errors.raise_pending()
    host = to_torch(buffer)
    return host.clone() if get_client().platform == "cpu" else host


def to_cpu(t) -> torch.Tensor:
    """The values of tpu tensor ``t`` on the host (runs pending deferred ops first)."""
    return download(modes.concrete(views.read(t)))


def from_cpu(host: torch.Tensor, requires_grad: bool = False):
    """A new dense tpu tensor with a copy of ``host``'s values."""
    t = new_tensor(upload(host), host.shape, host.dtype, requires_grad=requires_grad)
    return t
