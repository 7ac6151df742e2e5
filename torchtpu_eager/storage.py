"""Device storage: the PJRT buffer behind one or more tpu tensors (a base and its views).

PJRT buffers are immutable, so a write replaces the storage's buffer; every tensor viewing the
storage sees the new one. ``value`` is a PJRT buffer, a ``Lazy`` value of a deferred graph
(defer-and-fuse mode), or None for storage never written (read as zeros).

Memory accounting (``torch.tpu.memory_allocated``) counts the bytes of live storages.
"""
from __future__ import annotations

import threading
import weakref

_lock = threading.Lock()
_allocated = 0
_peak = 0
_live: "weakref.WeakSet[Storage]" = weakref.WeakSet()


class Storage:
    """Flat device memory of ``numel`` elements of ``dtype``; its buffer has shape ``shape``."""

    __slots__ = ("value", "shape", "dtype", "numel", "nbytes", "__weakref__")

    def __init__(self, value, shape: tuple, dtype, numel: int):
        global _allocated, _peak
        self.value = value
        self.shape = shape
        self.dtype = dtype
        self.numel = numel
        self.nbytes = numel * dtype.itemsize
        with _lock:
            _allocated += self.nbytes
            if _allocated > _peak:
                _peak = _allocated
        _live.add(self)

    def __del__(self):
        global _allocated
        with _lock:  # getattr: an instance made without __init__ was never counted
            _allocated -= getattr(self, "nbytes", 0)


def memory_allocated() -> int:
    """Bytes held by live tpu storages."""
    return _allocated


def max_memory_allocated() -> int:
    """The peak of ``memory_allocated()`` since start or the last reset."""
    return _peak


def reset_peak_memory_stats() -> None:
    global _peak
    with _lock:
        _peak = _allocated


def live_storages() -> list:
    """Every storage still referenced by a tensor (for synchronize and flushes)."""
    return list(_live)
