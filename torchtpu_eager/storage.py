"""Device storage: the PJRT buffer behind one or more tpu tensors (a base and its views).

PJRT buffers are immutable, so a write replaces the storage's buffer; every tensor viewing the
storage sees the new one. ``value`` is a PJRT buffer, a ``Lazy`` value of a deferred graph
(defer-and-fuse mode), or None for storage never written (read as zeros). A storage can be
freed and re-allocated in place (``resize_bytes``: FSDP2's ``untyped_storage().resize_``):
every tensor viewing it keeps its identity, only the device memory goes and comes back.

Memory accounting (``torch.tpu.memory_allocated``) counts the bytes of live storages.
"""
from __future__ import annotations

import threading
import weakref

_lock = threading.Lock()
_allocated = 0
_peak = 0
_live: weakref.WeakSet[Storage] = weakref.WeakSet()


class Storage:
    """Flat device memory of ``numel`` elements of ``dtype``; its buffer has shape ``shape``."""

    __slots__ = ("value", "shape", "dtype", "numel", "nbytes", "freed", "__weakref__")

    def __init__(self, value, shape: tuple, dtype, numel: int):
        global _allocated, _peak
        self.value = value
        self.shape = shape
        self.dtype = dtype
        self.numel = numel
        self.nbytes = numel * dtype.itemsize
        self.freed = False
        with _lock:
            _allocated += self.nbytes
            if _allocated > _peak:
                _peak = _allocated
        _live.add(self)

    def __del__(self):
        global _allocated
        with _lock:  # getattr: an instance made without __init__ was never counted
            if not getattr(self, "freed", True):
                _allocated -= getattr(self, "nbytes", 0)

    def resize_bytes(self, nbytes: int) -> None:
        """Free (``nbytes == 0``) or re-allocate (its full size) this storage's memory.

        Freeing drops the buffer; a read before the next write is an error. Re-allocating
        gives uninitialized memory (as on CUDA). Other sizes would change what the views
        mean, which nothing needs: an error naming both sizes.

        Example::

            st.resize_bytes(0)              # memory_allocated() drops by st.nbytes
            st.resize_bytes(st.nbytes)      # back, uninitialized
        """
        global _allocated, _peak
        if nbytes not in (0, self.nbytes):
            raise RuntimeError(f"tpu: a storage of {self.nbytes} bytes can be resized to 0 "
                               f"(freed) or back to {self.nbytes}, not to {nbytes}")
        freed = nbytes == 0
        if freed == self.freed:
            return
        with _lock:
            _allocated += -self.nbytes if freed else self.nbytes
            _peak = max(_peak, _allocated)
        self.value = None
        self.freed = freed


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
