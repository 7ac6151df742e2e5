"""torch tensors <-> PJRT buffers, with no copies on the CPU client.

Uploads go through a numpy view of the tensor, not DLPack: a buffer imported from torch's DLPack
capsule frees the tensor from whichever PJRT worker thread drops it last, and torch then takes
the GIL on that thread. At interpreter exit that kills the process (``terminate called without
an active exception``: the worker is unwound out of a noexcept destructor). jaxlib releases
numpy-backed buffers through its own queue, on a thread that holds the GIL. Downloads on the CPU
client are DLPack views, freed by torch on the thread that drops the tensor.

Parameters and buffers are uploaded once and stay resident: ``to_buffer(p, resident=True)``
returns the buffer made at the last call as long as the tensor was not modified since.
"""
from __future__ import annotations

import weakref

import torch
from jaxlib import _jax

from .. import counters
from .client import get_client

# id(tensor) -> (weakref, data_ptr, version, buffer); cleared when the tensor dies.
_resident: dict = {}

# Tensor types whose data already lives in PJRT buffers (the eager "tpu" device's tensors):
# type -> (tensor -> buffer, device type). Registered by torchtpu_eager.
_device_tensors: dict = {}
# device type -> (buffer -> tensor); "cpu" is to_torch.
_wrappers: dict = {}


def register_device_tensor(cls, read, device_type: str, wrap) -> None:
    """Let compiled programs take ``cls`` tensors and return tensors of ``device_type``.

    ``read(t)`` gives the PJRT buffer holding ``t``; ``wrap(buffer)`` a new tensor on it.

    Example::

        register_device_tensor(TpuTensor, read_buffer, "tpu", wrap_buffer)
    """
    _device_tensors[cls] = read
    _wrappers[device_type] = wrap


def _register_tpu_tensors() -> bool:
    # The eager device registers itself lazily (its autoload must not import jaxlib).
    from torchtpu_eager import compile_support
    compile_support.register_with_runtime()
    return True


def wrapper_for(device_type: str):
    """buffer -> tensor for results that live on ``device_type`` (host tensors by default)."""
    return _wrappers.get(device_type, to_torch)


# torch dtypes numpy lacks -> (same-width integer dtype to read the bits as, ml_dtypes name).
_REINTERPRETED = {
    torch.bfloat16: (torch.int16, "bfloat16"),
    torch.float8_e4m3fn: (torch.uint8, "float8_e4m3fn"),
    torch.float8_e5m2: (torch.uint8, "float8_e5m2"),
    torch.float8_e4m3fnuz: (torch.uint8, "float8_e4m3fnuz"),
    torch.float8_e5m2fnuz: (torch.uint8, "float8_e5m2fnuz"),
}
_avals: dict = {}
_shardings: dict = {}


def _host_array(tensor: torch.Tensor):
    """A numpy array viewing ``tensor``'s memory (a CPU, contiguous, grad-free tensor)."""
    reinterpret = _REINTERPRETED.get(tensor.dtype)
    if reinterpret is None:
        return tensor.numpy()
    import ml_dtypes
    bits, name = reinterpret
    return tensor.view(bits).numpy().view(getattr(ml_dtypes, name))


def upload(tensor: torch.Tensor, device):
    """A new jax array on ``device`` holding ``tensor``'s data (no copy where PJRT can alias).

    Example::

        arr = upload(torch.arange(3), get_client().device)
    """
    # The common case (a contiguous CPU tensor not requiring grad) takes no extra calls: this
    # runs for every input of every compiled call.
    if not tensor.is_cpu:
        tensor = tensor.cpu()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.is_complex():  # numpy cannot view lazily conjugated or negated memory
        tensor = tensor.resolve_conj().resolve_neg()
    array = _host_array(tensor)
    key = (array.shape, array.dtype)
    aval = _avals.get(key)
    if aval is None:
        from jax.core import ShapedArray
        if len(_avals) > 4096:  # many dynamic shapes: keep the table small, not exhaustive
            _avals.clear()
        aval = _avals.setdefault(key, ShapedArray(array.shape, array.dtype))
    sharding = _shardings.get(device)
    if sharding is None:
        from jax.sharding import SingleDeviceSharding
        sharding = _shardings.setdefault(device, SingleDeviceSharding(device))
    # Zero-copy where the memory is aligned; jaxlib holds ``array`` until the buffer is gone.
    return _jax.batched_device_put(aval, sharding, [array], [device], True, False,
                                    enable_x64=True)  # int64 and float64 stay 64-bit


def to_buffer(tensor: torch.Tensor, resident: bool = False, client=None):
    """A PJRT buffer holding ``tensor``'s data, on the process's device.

    With ``resident=True`` the buffer is remembered and reused while the tensor's storage and
    version counter are unchanged, so weights are not uploaded on every call.

    Example::

        buf = to_buffer(torch.ones(3))
        back = to_torch(buf)
    """
    read = _device_tensors.get(type(tensor))
    if read is not None:
        return read(tensor)
    if tensor.device.type == "tpu" and _register_tpu_tensors():
        return _device_tensors[type(tensor)](tensor)
    device = (client or get_client()).device
    if not resident:
        return upload(tensor, device)
    key = id(tensor)
    entry = _resident.get(key)
    version = tensor._version
    ptr = tensor.data_ptr()
    if entry is not None and entry[1] == ptr and entry[2] == version and entry[0]() is tensor:
        return entry[3]
    buf = upload(tensor, device)
    counters.add("resident_uploads")
    if entry is None:
        weakref.finalize(tensor, _resident.pop, key, None)
    _resident[key] = (weakref.ref(tensor), ptr, version, buf)
    return buf


def to_torch(buffer, client=None) -> torch.Tensor:
    """A torch CPU tensor viewing a PJRT buffer (zero-copy on the CPU client)."""
    if (client or get_client()).platform != "cpu":
        # Device memory is not host-addressable: copy to host first.
        import numpy as np
        array = np.asarray(buffer)
        if array.dtype.name == "bfloat16":  # numpy has no bf16: move the bits as int16
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(array)
    return torch._C._from_dlpack(_jax.buffer_to_dlpack_managed_tensor(buffer))


def resident_count() -> int:
    """How many tensors currently have a resident device buffer."""
    return len(_resident)
