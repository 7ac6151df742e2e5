"""Storage-level operations on tpu tensors that FSDP2 and stream users need.

- ``Tensor.record_stream(s)``: nothing to do, a buffer lives as long as a tensor holds it and
  the device runs in issue order (``streams.py``).
- FSDP2's own ops (``torch.ops.fsdp.*``: the all-gather copy-in, the split copy-out, the
  reduce-scatter chunk-cat, ``copy_``) run as the ATen ops they are made of, each on the
  device. Traced whole they would lose their aliasing (the copy-in returns a view of its
  output, which the tracer cannot express) and fall back to the host.
- Freeing and re-allocating a storage in place (``resize_storage_bytes_``). FSDP2 frees the
  unsharded parameters after forward and re-allocates them before the next all-gather, by
  ``tensor.untyped_storage().resize_(n)``, so that autograd's saved references stay valid.
  A tpu tensor's ``untyped_storage()`` is PyTorch's placeholder for a storage it does not own
  (no data pointer; ``resize_`` raises), so FSDP2's two helpers that call it are given a tpu
  branch (``install_fsdp_hooks``); every other device goes the original way.
- Moving a module's CPU states to the mesh's device. ``fully_shard(model, mesh=tpu_mesh)`` on
  a model built on the CPU (PyTorch's tutorials do so) moves each parameter by
  ``param.data = param.to(device)``, which a tpu tensor refuses; FSDP2's mover is given a tpu
  branch that moves them in place by swapping (``module_conversion.move_in_place``).

Example::

    w = torch.ones(1024, device="tpu")
    resize_storage_bytes_(w, 0)                  # memory released, w keeps its identity
    resize_storage_bytes_(w, w.numel() * 4)      # back, uninitialized
    w.copy_(torch.zeros(1024))
"""
from __future__ import annotations

import sys

import torch

from .device import NAME
from .dispatch import handles
from .serialization import device_storage
from .storage import live_storages
from .module_conversion import move_in_place
from .tensor import TpuTensor

aten = torch.ops.aten


@handles(aten.record_stream.default)
def record_stream(func, args, kwargs):
    """``t.record_stream(s)``: nothing to protect (module doc)."""
    return None


_FSDP_OPS = ("all_gather_copy_in", "split_with_sizes_copy", "chunk_cat")


def run_decomposed(func, args, kwargs):
    """Run a custom op through its PrivateUse1 kernel, a Python function of ATen ops (each of
    which comes back to ``dispatch`` with tpu tensors).

    Example::

        handles(torch.ops.fsdp.chunk_cat.default)(run_decomposed)
    """
    return func._op_dk(torch._C.DispatchKey.PrivateUse1, *args, **kwargs)


def fsdp_copy_(func, args, kwargs):
    """``fsdp.copy_(tensor, data)``: a copy into ``tensor``, through its view."""
    tensor, data = args
    tensor.copy_(data)


def register_fsdp_ops() -> None:
    """Route ``torch.ops.fsdp.*`` on tpu tensors to their ATen pieces (FSDP2 must be imported)."""
    fsdp = torch.ops.fsdp
    for name in _FSDP_OPS:
        handles(getattr(fsdp, name).default)(run_decomposed)
    handles(fsdp.copy_.default)(fsdp_copy_)


def resize_storage_bytes_(tensor: torch.Tensor, nbytes: int) -> None:
    """Free (0) or re-allocate (full size) the storage under a tpu ``tensor``, in place.

    Example::

        resize_storage_bytes_(x, 0)
    """
    if type(tensor) is not TpuTensor:
        tensor.untyped_storage().resize_(nbytes)
        return
    tensor._st.resize_bytes(nbytes)


def storage_bytes(tensor: torch.Tensor) -> int:
    """The current byte size of ``tensor``'s storage (0 when freed).

    Example::

        storage_bytes(torch.ones(4, device="tpu"))     # 16
    """
    if type(tensor) is not TpuTensor:
        return tensor.untyped_storage().size()
    return 0 if tensor._st.freed else tensor._st.nbytes


_installed = False


def install_fsdp_hooks() -> None:
    """Give FSDP2's ``alloc_storage`` / ``free_storage`` a branch for tpu tensors (idempotent).

    Example::

        install_fsdp_hooks()      # then fully_shard(model.to("tpu"), mesh=...) trains
    """
    global _installed
    if _installed:
        return
    from torch.distributed.fsdp._fully_shard import _fsdp_init, _fsdp_param
    original_alloc, original_free = _fsdp_param.alloc_storage, _fsdp_param.free_storage
    original_move = _fsdp_init._move_states_to_device

    def alloc_storage(tensor: torch.Tensor) -> None:
        if type(tensor) is not TpuTensor:
            return original_alloc(tensor)
        size = tensor.numel() * tensor.itemsize
        if storage_bytes(tensor) != size:
            resize_storage_bytes_(tensor, size)

    def free_storage(tensor: torch.Tensor) -> None:
        if type(tensor) is not TpuTensor:
            return original_free(tensor)
        if storage_bytes(tensor) != 0:
            resize_storage_bytes_(tensor, 0)

    def move_states_to_device(params, buffers, device) -> None:
        if device.type == NAME:
            from torch.distributed.tensor import DTensor
            for tensor in (*params, *buffers):
                if tensor.device.type not in (NAME, "meta") and not isinstance(tensor, DTensor):
                    move_in_place(tensor, device)
        original_move(params, buffers, device)   # its checks, and every other device

    # Every module of FSDP2 that imported them by name (_fsdp_param_group's world-size-1
    # path re-allocates through its own name: a mesh dim of 1 raised "storage was freed").
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group  # noqa: F401  (loaded)
    replaced = {original_alloc: alloc_storage, original_free: free_storage}
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("torch.distributed.fsdp._fully_shard."):
            for name in ("alloc_storage", "free_storage"):
                found = getattr(module, name, None)
                if found in replaced:
                    setattr(module, name, replaced[found])
    _fsdp_init._move_states_to_device = move_states_to_device
    register_fsdp_ops()
    _installed = True


@handles(aten.set_.source_Storage, aten.set_.source_Storage_storage_offset)
def set_storage(func, args, kwargs):
    """``t.set_(storage, offset, size, stride)``: PyTorch's ``_rebuild_tensor`` makes each
    tensor ``torch.load(map_location="tpu")`` loads this way, from a host storage restored for
    the device (``serialization.py``). Any other storage is refused, as CUDA refuses a storage
    of another device."""
    t, storage = args[0], args[1]
    if len(args) > 2:
        offset, size = args[2], tuple(args[3])
        stride = tuple(args[4]) if len(args) > 4 and args[4] else None
    else:
        offset, size, stride = 0, None, None
    source = device_storage(storage, t.dtype) or _own_storage(storage, t.dtype)
    if source is None:
        raise RuntimeError(
            f'Attempted to set the storage of a tensor on device "{t.device}" to a storage on '
            f'different device "{storage.device}".  This is no longer allowed; the devices '
            f"must match.")
    t._become(TpuTensor(source, (source.numel,) if size is None else size, stride, offset))
    return t


def _own_storage(storage, dtype: torch.dtype):
    """The device ``Storage`` behind a tpu tensor's own untyped storage (its data pointer is
    the Storage's id: ``tensor.set_storage_identity``), if of ``dtype``; else None. TorchScript's
    serializer views a parameter's whole storage this way to write it (``torch.jit.save``)."""
    if torch._C.StorageBase.device.__get__(storage).type != NAME:
        return None
    key = storage.data_ptr()
    found = next((s for s in live_storages() if id(s) == key), None)
    return found if found is not None and found.dtype == dtype else None
