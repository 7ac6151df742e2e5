"""Moving data between the host and the tpu device.

Uploads copy, during the call: a tpu tensor is a value of its own, so neither a zero-copy CPU
buffer (which would see a later write to the host tensor) nor an asynchronous transfer (which
could read the host tensor after the write) will do. Downloads copy for the same reason. The
exception is PyTorch's own: a ``non_blocking`` copy from pinned memory, whose caller promises
not to write the source until it synchronizes, is transferred asynchronously
(``runtime.transfer.upload(asynchronous=True)``); every download is such a synchronization, as
``.cpu()`` and ``.item()`` synchronize a CUDA stream.

Example::

    t = from_cpu(torch.arange(3.0))     # a TpuTensor
    to_cpu(t)                           # tensor([0., 1., 2.])
"""
from __future__ import annotations

import torch

from torchtpu_compile import index_errors
from torchtpu_compile.runtime.client import get_client
from torchtpu_compile.runtime import transfer as runtime_transfer
from torchtpu_compile.runtime.transfer import to_torch

from . import modes, views
from .tensor import contiguous_strides, memory_layout, new_tensor, strided_tensor


def upload(host: torch.Tensor, asynchronous: bool = False):
    """A PJRT buffer holding a copy of host tensor ``host``; with ``asynchronous=True`` the
    copy may be taken after the call (the caller does not write ``host`` until
    ``torch.tpu.synchronize()`` or a download)."""
    # A conjugate or negative bit is a lazy flag, not values: a buffer holds the values.
    host = host.detach().resolve_conj().resolve_neg()
    return runtime_transfer.upload(host, get_client().device, copy=True,
                                   asynchronous=asynchronous)


def download(buffer) -> torch.Tensor:
    """A host tensor holding a copy of a (concrete) PJRT buffer.

    A synchronization point: an index out of range found by an op that ran before is raised
    here (``torchtpu_compile.index_errors``), as CUDA raises a device-side assert at the next
    synchronization.
    """
    if index_errors.has_pending():
        index_errors.raise_pending()
    if runtime_transfer._in_flight:  # non_blocking uploads: done before the host goes on
        runtime_transfer.wait_uploads()
    host = to_torch(buffer)
    return host.clone() if get_client().platform == "cpu" else host


def to_cpu(t) -> torch.Tensor:
    """The values of tpu tensor ``t`` on the host (runs pending deferred ops first).

    A tensor that is all of its storage in a permuted order comes back with its strides, as
    eager's ``.cpu()`` of a CUDA tensor keeps a dense layout (``preserve_format``): its storage
    already holds the values in that order, so no transpose runs on the device."""
    if t.numel() == 0:
        # No value to wait for (views.read makes an empty buffer), but a download is still a
        # synchronization point: deferred ops run, so an index out of range recorded before
        # raises here, as it does at a download of a tensor with elements.
        modes.current().flush()
    order = views.storage_order(t)
    if order is None:
        return download(modes.concrete(views.read(t)))
    host = download(modes.concrete(views.storage_value(t._st)))
    return host.set_(host.untyped_storage(), 0, t.shape, t.stride())


def not_dense(layout, op=None) -> NotImplementedError:
    """The error for a tensor of ``layout`` (sparse, quantized) bound for the tpu device.

    Example::

        raise not_dense(torch.sparse_coo)    # in .to("tpu") of a sparse tensor
    """
    where = f"{op}: " if op is not None else "tpu: "
    return NotImplementedError(
        f"{where}tensors of layout {layout} cannot be moved to or made on the tpu device, "
        f"which holds dense (torch.strided) tensors only; convert with .to_dense() first "
        f"(torch.sparse.mm(a, b) becomes a.to_dense() @ b), or keep it on the CPU. "
        f"nn.Embedding and nn.EmbeddingBag with sparse=True make sparse gradients: on the "
        f"device use sparse=False (any optimizer then takes them)")


def from_cpu(host: torch.Tensor, requires_grad: bool = False):
    """A new tpu tensor with a copy of ``host``'s values and, where ``host`` is dense (a
    permuted layout: ``x.t()``, channels-last), its strides, as ``.to("cuda")`` keeps them."""
    if host.layout != torch.strided:
        # A device buffer is one dense array: PyTorch's sparse and quantized layouts have no
        # tpu form (the upload failed with "unsupported memory format option Contiguous").
        raise not_dense(host.layout)
    shape, stride = tuple(host.shape), tuple(host.stride())
    order = None if stride == contiguous_strides(shape) else memory_layout(shape, stride)
    if order is None:  # contiguous; or gaps or overlap, where eager's copy is contiguous
        return new_tensor(upload(host), host.shape, host.dtype, requires_grad=requires_grad)
    return strided_tensor(upload(host.permute(order)), host.shape, host.stride(), host.dtype,
                          requires_grad=requires_grad)
