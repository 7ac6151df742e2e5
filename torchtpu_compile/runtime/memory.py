"""Device memory figures: the bytes of the live PJRT buffers of this process, counted in one place.

Every device buffer the runtime makes comes from an upload (``transfer.upload``) or is an
output of a program (``Executable.run``): both hand their new buffers to ``track``, which adds
their size and subtracts it when the buffer object dies (a weak reference's callback). So the
figures cover whatever holds a buffer -- tpu tensors, weights a compiled model keeps resident,
outputs of programs still running -- and a buffer two tensors share counts once. Memory never
written (``torch.empty(..., device="tpu")`` before any write) holds no buffer and counts
nothing. Where the platform's allocator reports figures of its own (TPU, GPU:
``device.memory_stats()``), ``platform_stats`` gives them; the PJRT CPU client reports none.

Example::

    from torchtpu_compile.runtime import memory
    memory.snapshot()["allocated_bytes"]      # bytes of live buffers
"""
from __future__ import annotations

import threading
import weakref

# Reentrant: a buffer can die (and its callback run) while this thread is inside track().
_lock = threading.RLock()
_refs: dict = {}        # id(weak reference) -> (weak reference, bytes)
_figures = {"allocated_bytes": 0, "peak_allocated_bytes": 0, "allocated_total": 0,
            "freed_total": 0, "allocations": 0, "peak_allocations": 0,
            "allocations_total": 0, "frees_total": 0}


def _released(ref) -> None:
    with _lock:
        entry = _refs.pop(id(ref), None)
        if entry is None:
            return
        _figures["allocated_bytes"] -= entry[1]
        _figures["freed_total"] += entry[1]
        _figures["allocations"] -= 1
        _figures["frees_total"] += 1


_device = None   # the client's device: buffers elsewhere (jax's host CPU device) are not ours


def track(buffers, sizes=None, device=None):
    """Count new PJRT buffers (``sizes``: their bytes, when the caller knows them) if they are
    on the client's device (``device``: theirs, None for the client's); returns ``buffers``.

    Example::

        outputs = memory.track(loaded.execute(...))
    """
    global _device
    if device is not None:
        if _device is None:
            from .client import get_client
            _device = get_client().device
        if device != _device:
            return buffers
    with _lock:
        for i, buffer in enumerate(buffers):
            nbytes = buffer.nbytes if sizes is None else sizes[i]
            ref = weakref.ref(buffer, _released)
            _refs[id(ref)] = (ref, nbytes)
            _figures["allocated_bytes"] += nbytes
            _figures["allocated_total"] += nbytes
            _figures["allocations"] += 1
            _figures["allocations_total"] += 1
        if _figures["allocated_bytes"] > _figures["peak_allocated_bytes"]:
            _figures["peak_allocated_bytes"] = _figures["allocated_bytes"]
        if _figures["allocations"] > _figures["peak_allocations"]:
            _figures["peak_allocations"] = _figures["allocations"]
    return buffers


def snapshot() -> dict:
    """The figures now: ``allocated_bytes`` (live buffers), ``peak_allocated_bytes`` (since
    start or ``reset_peaks``), ``allocations`` (live buffers), cumulative totals."""
    with _lock:
        return dict(_figures)


def reset_peaks() -> None:
    """Start the peaks again from the current figures."""
    with _lock:
        _figures["peak_allocated_bytes"] = _figures["allocated_bytes"]
        _figures["peak_allocations"] = _figures["allocations"]


def platform_stats(device) -> dict:
    """The platform allocator's own figures (PJRT ``memory_stats``: ``bytes_in_use``,
    ``peak_bytes_in_use``, ``bytes_limit``, ...), or {} where it reports none (CPU client)."""
    try:
        return dict(device.memory_stats() or {})
    except Exception:  # a plugin without memory statistics
        return {}
