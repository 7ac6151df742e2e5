"""Pinned host memory with "tpu" registered: ``Tensor.pin_memory()``, ``is_pinned()`` and
``DataLoader(pin_memory=True)``.

Registering "tpu" makes it PyTorch's current accelerator, and PyTorch's pinning
(``at::_pin_memory``, ``at::is_pinned``) asks the current accelerator's C++ hooks for a
pinned-memory allocator. A Python backend's hooks (``torch._C._acc.PrivateUse1Hooks``) cannot
supply one, so every ``pin_memory()`` raised ``NotImplementedError`` -- in plain CPU scripts too,
since ``DataLoader(pin_memory=True)`` pins whenever an accelerator is present. We serve the two
ops for dense CPU tensors instead: a pinned tensor is a fresh host copy, remembered by a weak
reference to its storage so that ``is_pinned()`` is true for it and its views only.

PJRT copies host memory into device buffers itself; the CPU client needs no page-locked
memory, so ordinary host memory is what "pinned" means here. (``torch.empty(...,
pin_memory=True)`` asks the C++ hooks for the allocator directly and still raises.)

Example::

    x = torch.randn(4).pin_memory()
    assert x.is_pinned() and not torch.randn(4).is_pinned()
    y = x.to("tpu", non_blocking=True)
"""
from __future__ import annotations

import threading

import torch

_lock = threading.Lock()
_pinned: dict = {}        # storage data_ptr -> StorageWeakRef of the pinned storage
_libraries: list = []     # registrations live as long as their Library object


def _weak_ref(storage):
    from torch.multiprocessing.reductions import StorageWeakRef
    return StorageWeakRef(storage)


def _forget_expired() -> None:
    for ptr in [p for p, ref in _pinned.items() if ref.expired()]:
        del _pinned[ptr]


def is_pinned(self: torch.Tensor, device=None) -> bool:
    """``aten::is_pinned`` for CPU tensors: true for memory made by ``pin_memory()``."""
    storage = self.untyped_storage()
    ptr = storage.data_ptr()
    with _lock:
        ref = _pinned.get(ptr)
        # Same address, other storage: the pinned one was freed and its memory reused.
        return ref is not None and not ref.expired() and ref.cdata == storage._cdata


def pin_memory(self: torch.Tensor, device=None) -> torch.Tensor:
    """``aten::_pin_memory`` for CPU tensors: a copy with the same sizes and strides, in memory
    that ``is_pinned()`` reports as pinned."""
    out = torch.empty_strided(self.size(), self.stride(), dtype=self.dtype, device="cpu")
    out.copy_(self)
    storage = out.untyped_storage()
    if storage.nbytes():  # nothing to pin in an empty tensor (no address either)
        with _lock:
            _forget_expired()
            _pinned[storage.data_ptr()] = _weak_ref(storage)
    return out


def register() -> None:
    """Serve ``is_pinned`` and ``_pin_memory`` for CPU tensors (called by ``device.register``)."""
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("is_pinned", is_pinned, "CPU")
    lib.impl("_pin_memory", pin_memory, "CPU")
    _libraries.append(lib)
