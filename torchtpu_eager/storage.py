"""Device storage: the PJRT buffer behind one or more tpu tensors (a base and its views).

PJRT buffers are immutable, so a write replaces the storage's buffer; every tensor viewing the
storage sees the new one. ``value`` is a PJRT buffer, a ``Lazy`` value of a deferred graph
(defer-and-fuse mode), or None for storage never written (read as zeros). A storage can be
freed and re-allocated in place (``resize_bytes``: FSDP2's ``untyped_storage().resize_``):
every tensor viewing it keeps its identity, only the device memory goes and comes back.

Memory figures (``torch.tpu.memory_allocated``) are not counted here but where PJRT buffers
are made (``torchtpu_compile.runtime.memory``): storages can share one buffer, and buffers live
outside storages too (resident weights, programs in flight).
"""
from __future__ import annotations

import weakref

# Weak references to every storage made, without a callback: a WeakSet's removal callback was a
# Python call at every storage's death (every eager op makes one). The dead references are
# dropped in bulk when the table has doubled since the last sweep, and by live_storages().
# Keyed by the reference's own id, not held in a set: a weak reference hashes as its referent,
# and a storage made right after one died usually takes its address, so a set of dead
# references chained them all under one hash and every insert walked the chain (40 us an op).
_live: dict = {}
_ref = weakref.ref
_sweep_at = [4096]


def _sweep() -> list:
    """Drop the dead references; the live storages. (A copy is iterated: another thread may
    add a storage meanwhile, and copying the table is one step under the GIL.)"""
    entries = list(_live.items())
    live = []
    for key, ref in entries:
        storage = ref()
        if storage is None:
            _live.pop(key, None)
        else:
            live.append(storage)
    _sweep_at[0] = max(4096, 2 * len(_live))
    return live


class Storage:
    """Flat device memory of ``numel`` elements of ``dtype``; its buffer has shape ``shape``."""

    __slots__ = ("value", "shape", "dtype", "numel", "nbytes", "freed", "stands_for",
                 "__weakref__")

    def __init__(self, value, shape: tuple, dtype, numel: int):
        self.value = value
        self.shape = shape
        self.dtype = dtype
        self.numel = numel
        self.nbytes = numel * dtype.itemsize
        self.freed = False
        # The view op whose result this storage holds computed, not viewed (view(dtype),
        # conj()): a write to it would not reach the base (views.check_writable). Or a
        # views.Reinterpreted link, which carries writes between a storage and those computed
        # from it by view_as_real / view_as_complex.
        self.stands_for = None
        ref = _ref(self)
        _live[id(ref)] = ref
        if len(_live) > _sweep_at[0]:
            _sweep()

    def resize_bytes(self, nbytes: int) -> None:
        """Free (``nbytes == 0``) or re-allocate (its full size) this storage's memory.

        Freeing drops the buffer; a read before the next write is an error. Re-allocating
        gives uninitialized memory (as on CUDA). Other sizes would change what the views
        mean, which nothing needs: an error naming both sizes.

        Example::

            st.resize_bytes(0)              # its buffer goes: memory_allocated() drops
            st.resize_bytes(st.nbytes)      # back, uninitialized (a buffer at the next write)
        """
        if nbytes not in (0, self.nbytes):
            raise RuntimeError(f"tpu: a storage of {self.nbytes} bytes can be resized to 0 "
                               f"(freed) or back to {self.nbytes}, not to {nbytes}")
        freed = nbytes == 0
        if freed == self.freed:
            return
        self.value = None
        self.freed = freed


def live_storages() -> list:
    """Every storage still referenced by a tensor (for synchronize and flushes)."""
    return _sweep()
