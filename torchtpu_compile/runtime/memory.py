"""Device memory figures: the bytes of the live PJRT buffers of this process, counted in one place.

Every device buffer the runtime makes comes from an upload (``transfer.upload``) or is an
output of a program (``Executable.run``): both hand their new buffers to ``track``, which adds
their size and subtracts it when the buffer object dies (a weak reference's callback). The
inputs a compiled call uploads for itself alone die within the call: ``transient`` counts them,
made and freed at once. So the
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

from jaxlib import _jax

from .. import _native
from ..profiling import TORCH_PROFILER, memory_sample

# Reentrant: a buffer can die (and its callback run) while this thread is inside track().
_lock = threading.RLock()
_refs: dict = {}        # id(weak reference) -> (weak reference, bytes)
_device = None          # the client's device (buffers on jax's host CPU device are not ours)
# Live bytes and buffers, their peaks, and what was freed (totals made = live + freed).
_bytes = _count = _peak_bytes = _peak_count = _freed_bytes = _freed_count = 0
# What was live when the totals last restarted (reset_totals): made = live + freed - these.
_base_bytes = _base_count = 0


def _forget(key: int) -> bool:
    """Count the tracked buffer of weakref id ``key`` as freed (under ``_lock``); whether it
    was tracked. A freed buffer is reported to the profiler's memory timeline."""
    global _bytes, _count, _freed_bytes, _freed_count
    entry = _refs.pop(key, None)
    if entry is None:
        return False
    _bytes -= entry[1]
    _count -= 1
    _freed_bytes += entry[1]
    _freed_count += 1
    if TORCH_PROFILER._is_profiler_enabled:
        _native.report_memory(key, -entry[1], _bytes)
    return True


def _released(ref) -> None:
    with _lock:
        if _forget(id(ref)) and TORCH_PROFILER._is_profiler_enabled:
            memory_sample(_bytes)  # the memory timelines (profiling.py)


def track(buffers, sizes=None, device=None):
    """Count new PJRT buffers (``sizes``: their bytes, when the caller knows them) if they are
    on the client's device (``device``: theirs, None for the client's); returns ``buffers``.

    Runs for every buffer made (each eager op's outputs): kept to a weak reference and a few
    additions.

    Example::

        outputs = memory.track(loaded.execute(...))
    """
    global _device, _bytes, _count, _peak_bytes, _peak_count
    if device is not None:
        if _device is None:
            from .client import get_client
            _device = get_client().device
        if device != _device:
            return buffers
    if sizes is None:
        sizes = [buffer.nbytes for buffer in buffers]
    with _lock:
        # The profiler's memory timeline (profile_memory=True) takes each allocation from C++;
        # off the profiler, the one check per call is all this costs.
        profiled = TORCH_PROFILER._is_profiler_enabled
        for buffer, nbytes in zip(buffers, sizes):
            ref = weakref.ref(buffer, _released)
            _refs[id(ref)] = (ref, nbytes)
            _bytes += nbytes
            if profiled:  # a no-op in C++ unless the profiler records memory
                _native.report_memory(id(ref), nbytes, _bytes)
        _count += len(sizes)
        if _bytes > _peak_bytes:
            _peak_bytes = _bytes
        if _count > _peak_count:
            _peak_count = _count
        if profiled:  # the memory counter track DeviceEvents merges (profiling.py)
            memory_sample(_bytes)
    return buffers


def untrack(buffer) -> None:
    """Stop counting live ``buffer`` as allocated: a cache holds it (the eager device's
    uploaded scalars and positions, ``scalars.as_input``), as a caching allocator holds
    reserved memory. CUDA passes such values as kernel arguments, so ``memory_allocated()``
    moved by 8 bytes around an op where CUDA's does not.

    Example::

        buffer = upload(torch.tensor([3]), device)
        memory.untrack(buffer)      # memory_allocated() as before the upload
    """
    global _bytes, _count
    with _lock:
        for ref in weakref.getweakrefs(buffer):
            entry = _refs.pop(id(ref), None)
            if entry is not None:
                _bytes -= entry[1]
                _count -= 1


def transient(nbytes: int, count: int) -> None:
    """Count ``count`` buffers of ``nbytes`` bytes in all, made and freed within one call (a
    compiled call's inputs uploaded for it alone, ``transfer.to_buffers``).

    They reach the peaks and the totals as ``track`` would have counted them, with no weak
    reference each and no callback when they die (every compiled call makes them).

    Example::

        memory.transient(x.nbytes + y.nbytes, 2)
    """
    global _peak_bytes, _peak_count, _freed_bytes, _freed_count
    with _lock:
        if _bytes + nbytes > _peak_bytes:
            _peak_bytes = _bytes + nbytes
        if _count + count > _peak_count:
            _peak_count = _count + count
        _freed_bytes += nbytes
        _freed_count += count


def donated(buffers) -> None:
    """Count as freed the ``buffers`` a program was given to reuse (``Executable.run`` with
    donation) that PJRT did take: deleted now, their memory is the program's outputs', which
    are counted when they are tracked. A buffer PJRT copied instead (an external reference
    held it) is still live and still counted.

    Runs before the outputs are tracked, so that the peak sees the memory once.

    Example::

        memory.donated([params_buffer])
    """
    with _lock:
        for buffer in buffers:
            if not buffer.is_deleted():
                continue
            for ref in weakref.getweakrefs(buffer):  # no index by buffer: none on the hot path
                _forget(id(ref))
        if TORCH_PROFILER._is_profiler_enabled:
            memory_sample(_bytes)


def release_dropped() -> None:
    """Free now the buffers whose last holder was a host tensor that died since: results seen
    through DLPack (``transfer.host_tensors``) and zero-copy uploads (their numpy views).

    jaxlib does not release the Python reference such a holder keeps: it queues it, and empties
    the queue only when Python's garbage collector runs (jax's ``gc.callbacks`` hook). Until
    then the memory stays allocated. In a compiled training step that was a gradient, every
    parameter's new value (copied back into the parameter) and each moment's old memory, 4 x
    the parameters between two collections (the GPT-2 step of ``bench/memory.py``: 684 MB).
    A dropped upload holds a view of a result in turn, so its release queues one more: the
    queue is emptied a few rounds over. A release PJRT makes on its own thread when a
    program's use of an input ends can land just after this returns: the next call frees it.

    Example::

        del host_result        # a DLPack view of a program's result
        release_dropped()      # its buffer is freed here, not at the next gc
    """
    for _ in range(_RELEASE_ROUNDS):
        _collect_garbage()


# Each round can queue the next: a dropped upload's numpy view frees the host tensor it viewed,
# itself a DLPack view of an earlier result (a parameter's old value, adopted last step). A
# chain of two is what training steps make; a round on an empty queue costs 0.1 us, so every
# round runs (a round that frees no tracked buffer may still have queued the next link).
_RELEASE_ROUNDS = 4
_collect_garbage = _jax.collect_garbage


def snapshot() -> dict:
    """The figures now: ``allocated_bytes`` and ``allocations`` (live buffers), their peaks
    (since start or ``reset_peaks``), and totals made and freed. Buffers whose holders died
    are freed first (``release_dropped``): the figures are what is live."""
    release_dropped()
    with _lock:
        return {"allocated_bytes": _bytes, "peak_allocated_bytes": _peak_bytes,
                "allocated_total": _bytes + _freed_bytes - _base_bytes,
                "freed_total": _freed_bytes,
                "allocations": _count, "peak_allocations": _peak_count,
                "allocations_total": _count + _freed_count - _base_count,
                "frees_total": _freed_count}


def reset_peaks() -> None:
    """Start the peaks again from the current figures."""
    global _peak_bytes, _peak_count
    with _lock:
        _peak_bytes, _peak_count = _bytes, _count


def reset_totals() -> None:
    """Start the totals made and freed again from zero (``torch.cuda``'s
    ``reset_accumulated_memory_stats``); the live figures and peaks stay."""
    global _freed_bytes, _freed_count, _base_bytes, _base_count
    with _lock:
        _freed_bytes = _freed_count = 0
        _base_bytes, _base_count = _bytes, _count


def platform_stats(device) -> dict:
    """The platform allocator's own figures (PJRT ``memory_stats``: ``bytes_in_use``,
    ``peak_bytes_in_use``, ``bytes_limit``, ...), or {} where it reports none (CPU client)."""
    try:
        return dict(device.memory_stats() or {})
    except Exception:  # a plugin without memory statistics
        return {}
