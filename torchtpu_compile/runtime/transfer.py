"""torch tensors <-> PJRT buffers, with no copies on the CPU client.

Uploads go through a numpy view of the tensor, not DLPack: a buffer imported from torch's DLPack
capsule frees the tensor from whichever PJRT worker thread drops it last, and torch then takes
the GIL on that thread. At interpreter exit that kills the process (``terminate called without
an active exception``: the worker is unwound out of a noexcept destructor). jaxlib releases
numpy-backed buffers through its own queue, on a thread that holds the GIL. Downloads on the CPU
client are DLPack views, freed by torch on the thread that drops the tensor.

Parameters and buffers stay resident only where that cannot go stale: a device buffer of a host
tensor is reused across calls only when it *is* the tensor's memory (a zero-copy upload on the
CPU client, see ``aliases``), so every write to the tensor, whatever route it takes (in place,
``.data``, numpy, ``set_``, an optimizer step), is what the next call reads. A copy (memory
PJRT cannot alias: not 64-byte aligned, or any non-CPU platform) is made again at every call;
tensors of the eager tpu device are their own device buffers and need neither (the device
registers them in ``device_tensors.py``).

Asynchronous uploads (``upload(..., asynchronous=True)``: the eager device's ``non_blocking``
copies from pinned memory) are PyTorch's contract for such a copy: the caller does not write the
source until it synchronizes. PJRT then transfers from the source's memory after the call
returns (jaxlib's ``ZERO_COPY`` semantics on a buffer it cannot alias), and the source is held
(by jaxlib until the transfer is done, and in ``_in_flight`` here until a synchronization) so
that neither torch nor the pinned allocator reuses its memory before. ``wait_uploads`` is that
synchronization (``torch.tpu.synchronize()``, every download). On the CPU client a 64-byte
aligned source would be aliased for good, not copied, so it is copied during the call as a
blocking copy is; other sources of 100 KiB or more are copied on the client's thread pool.
"""
from __future__ import annotations

import weakref

import torch
from jaxlib import _jax

from .. import counters
from ..errors import raise_if_out_of_memory
from .._logging import info_once, warn_once
from ..profiling import TORCH_PROFILER, around, reentered
from . import memory
from .client import get_client
from .device_tensors import READERS, WRAPPERS

# id(tensor) -> (weakref, layout, buffer, memory) for buffers that alias their tensor's
# memory; layout is (data_ptr, shape, strides, dtype) at upload; memory says whose it is:
# _ADOPTED, the buffer's (``adopt``); _OWN, torch's allocator's or a program result's (an
# upload's numpy view of it); _SHARED, memory something else may hold too (``from_numpy``,
# ``frombuffer``, ``from_file``, ``share_memory_``: none of torch's counts see that holder).
# Cleared when the tensor dies.
_resident: dict = {}
_ADOPTED, _OWN, _SHARED = "adopted", "own", "shared"
# (weakref to the buffer, host tensor) of each asynchronous upload since the last wait_uploads:
# its source, kept from reuse until the transfer is known to be done.
_in_flight: list = []
_ZERO_COPY = _jax.HostBufferSemantics.ZERO_COPY


def wrapper_for(device_type: str):
    """buffer -> tensor for results that live on ``device_type`` (host tensors by default)."""
    return WRAPPERS.get(device_type, to_torch)


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
        try:
            return tensor.numpy()
        except TypeError:  # numpy's "Got unsupported ScalarType ComplexHalf"
            raise TypeError(no_element_type(tensor.dtype)) from None
    import ml_dtypes
    bits, name = reinterpret
    return tensor.view(bits).numpy().view(getattr(ml_dtypes, name))


def no_element_type(dtype: torch.dtype) -> str:
    """What to say of a torch dtype XLA has no element type for (``torch.complex32``).

    Example::

        raise TypeError(no_element_type(torch.complex32))
    """
    hint = " (use torch.complex64: x.to(torch.complex64))" if dtype is torch.complex32 else ""
    return (f"{dtype} tensors cannot live on an XLA device: XLA has no such element "
            f"type{hint}")


def _aval(array):
    from jax.core import ShapedArray
    if len(_avals) > 4096:  # many dynamic shapes: keep the table small, not exhaustive
        _avals.clear()
    return _avals.setdefault((array.shape, array.dtype), ShapedArray(array.shape, array.dtype))


def _sharding(device):
    from jax.sharding import SingleDeviceSharding
    return _shardings.setdefault(device, SingleDeviceSharding(device))


def upload(tensor: torch.Tensor, device, copy: bool = False, asynchronous: bool = False):
    """A new jax array on ``device`` holding ``tensor``'s data (no copy where PJRT can alias).

    ``copy=True``: a buffer of its own, taken during the call, that no later write to
    ``tensor`` reaches (the eager device's ``.to("tpu")``). With ``asynchronous=True`` too, the
    caller promises not to write ``tensor`` until ``wait_uploads()``: the transfer may then
    read it after the call returns (a ``non_blocking`` copy from pinned memory; module doc).

    Example::

        arr = upload(torch.arange(3), get_client().device)
    """
    # The common case (a contiguous CPU tensor not requiring grad) takes no extra calls: this
    # runs for every upload of the eager device (compiled calls: ``to_buffers``).
    if TORCH_PROFILER._is_profiler_enabled and not reentered():
        return around("torchtpu::upload", upload, tensor, device, copy,
                      bytes=tensor.numel() * tensor.element_size())
    own = False  # tensor is already a private copy: no second one for copy=True
    if not tensor.is_cpu:
        tensor, own = tensor.cpu(), True
    if not tensor.is_contiguous():
        tensor, own = tensor.contiguous(), True
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.is_complex():  # numpy cannot view lazily conjugated or negated memory
        resolved = tensor.resolve_conj().resolve_neg()
        own = own or resolved is not tensor
        tensor = resolved
    array = _host_array(tensor)
    aval = _avals.get((array.shape, array.dtype))
    if aval is None:
        aval = _aval(array)
    sharding = _shardings.get(device)
    if sharding is None:
        sharding = _sharding(device)
    try:
        if asynchronous and (device.platform != "cpu" or tensor.data_ptr() % _ALIGNMENT):
            # PJRT cannot alias this memory, so ZERO_COPY means: transfer from it after the
            # call, holding ``array`` (and so ``tensor``) until done.
            buffer = _jax.batched_device_put(aval, sharding, [array], [device], True, False,
                                              _ZERO_COPY, enable_x64=True)
            _hold_until_waited(buffer, tensor)
        else:
            # Zero-copy where the memory is aligned; jaxlib holds ``array`` until the buffer
            # is gone. force_copy copies during the call (PJRT's "immutable only during call").
            buffer = _jax.batched_device_put(aval, sharding, [array], [device], True,
                                              copy and not own,
                                              enable_x64=True)  # int64, float64 stay 64-bit
    except _jax.JaxRuntimeError as exc:
        raise_if_out_of_memory(exc, f"copying a tensor of shape {list(tensor.shape)} and dtype "
                                    f"{tensor.dtype} to the device")
        raise
    memory.track((buffer,), (array.nbytes,), device)
    return buffer


def _hold_until_waited(buffer, tensor: torch.Tensor) -> None:
    # Transfers that have finished let go of their sources here, so a loop that never
    # synchronizes holds only the ones still running.
    if _in_flight:
        _in_flight[:] = [(ref, held) for ref, held in _in_flight
                         if (b := ref()) is not None and not b.is_ready()]
    _in_flight.append((weakref.ref(buffer), tensor))


def wait_uploads() -> None:
    """Block until every asynchronous upload so far has finished reading its source, then let
    go of the sources: after this the caller may write them (``torch.tpu.synchronize()`` and
    every download call it, as a CUDA stream synchronization completes earlier copies).

    Example::

        buf = upload(pinned, get_client().device, copy=True, asynchronous=True)
        wait_uploads()
        pinned.fill_(0)              # buf keeps the values it was given
    """
    while _in_flight:
        ref, _ = _in_flight.pop()
        buffer = ref()
        # A buffer already dead needs no wait: jaxlib keeps its source until its transfer
        # is done, and nothing reads what it transferred.
        if buffer is not None:
            buffer.block_until_ready()


def uploads_done() -> bool:
    """Whether every asynchronous upload so far has finished (no wait).

    Example::

        if not uploads_done(): wait_uploads()
    """
    return all(b is None or b.is_ready() for b in (ref() for ref, _ in _in_flight))


def aliases(buffer, tensor: torch.Tensor, platform: str) -> bool:
    """Whether ``buffer`` is ``tensor``'s own memory: a zero-copy upload on the CPU client.

    The one rule for keeping a device buffer of a host tensor across calls: only a buffer that
    aliases the tensor sees every later write to it, whichever route the write takes; a copy
    could be stale. Non-CPU platforms always copy (a device pointer is never host memory).

    Example::

        t = torch.ones(4)
        aliases(upload(t, get_client().device), t, "cpu")      # True: 64-byte aligned
        aliases(upload(t[1:], get_client().device), t[1:], "cpu")  # False: PJRT copied
    """
    return platform == "cpu" and buffer.unsafe_buffer_pointer() == tensor.data_ptr()


# PJRT's CPU client aliases host memory at this alignment only (torch's allocator gives it).
_ALIGNMENT = 64


def shareable(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, or a copy of it in torch's own (aligned) memory where the CPU client could
    not alias it: for host tensors kept for many calls (an artifact's weights).

    Example::

        w = shareable(torch.from_numpy(array))   # resident from then on, on the CPU client
    """
    return tensor if tensor.data_ptr() % _ALIGNMENT == 0 else tensor.clone()


def _note_copied(tensor: torch.Tensor, platform: str) -> None:
    counters.add("resident_copies")
    what = f"{str(tensor.dtype).replace('torch.', '')}{list(tensor.shape)}"
    if platform != "cpu":
        warn_once(("resident-copies", platform),
                  "torchtpu: the compiled model's parameters and buffers (%s, ...) live on the "
                  "host: on %s they are uploaded at every call, since a copy kept on the device "
                  "would miss a later write to them. Move the model to the tpu device "
                  "(model.to('tpu')) to keep its weights on the device.", what, platform)
    else:
        info_once(("resident-copies", platform),
                  "torchtpu: a parameter or buffer (%s) is not 64-byte aligned (torch.from_numpy "
                  "memory?), so PJRT cannot share it and it is copied at every call; .clone() "
                  "it, or move the model to the tpu device, to keep it resident.", what)


def to_buffer(tensor: torch.Tensor, resident: bool = False, client=None):
    """A PJRT buffer holding ``tensor``'s data, on the process's device.

    With ``resident=True`` (parameters, buffers, a graph's constants) a buffer that aliases the
    tensor's memory is remembered and reused while the tensor keeps that memory and layout:
    weights are then never uploaded again, and every write to them is seen. A buffer that is a
    copy is not kept: it is made again at the next call (``aliases`` says which).

    Example::

        buf = to_buffer(torch.ones(3))
        back = to_torch(buf)
    """
    read = READERS.get(type(tensor))  # a device's own tensors (device_tensors.py)
    if read is not None:
        return read(tensor)
    client = client or get_client()
    device = client.device
    if not resident:
        return upload(tensor, device)
    key = id(tensor)
    entry = _resident.get(key)
    layout = (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype)
    if entry is not None and entry[1] == layout and entry[0]() is tensor:
        return entry[2]
    memory = _whose_memory(tensor, client)  # (before the upload's numpy view)
    buf = upload(tensor, device)
    counters.add("resident_uploads")
    if not aliases(buf, tensor, client.platform):
        _resident.pop(key, None)
        _note_copied(tensor, client.platform)
        return buf
    if entry is None:
        weakref.finalize(tensor, _resident.pop, key, None)
    _resident[key] = (weakref.ref(tensor), layout, buf, memory)
    return buf


def _whose_memory(tensor: torch.Tensor, client) -> str:
    """``_OWN`` where ``tensor``'s memory is torch's allocator's (its storage resizable, not
    shared) or a program result's (a live PJRT buffer's: an optimizer state a compiled step
    made); else ``_SHARED``: a numpy array, a bytearray, a file or a DLPack producer may hold
    it too (their storages are not resizable). Asked once per resident upload; the live
    buffers are listed only for a tensor ``adopt`` could take (on the CPU client, a plain
    tensor not requiring grad: not the weights, which may be mapped from a file)."""
    if client.platform != "cpu" or type(tensor) is not _Tensor or tensor.requires_grad:
        return _SHARED  # never adopted
    storage = tensor.untyped_storage()
    if storage.is_shared():
        return _SHARED
    if storage.resizable():
        return _OWN
    pointer = storage.data_ptr()
    return _OWN if any(buffer.unsafe_buffer_pointer() == pointer
                       for buffer in client.pjrt.live_buffers()) else _SHARED


def keep_aliased(tensor: torch.Tensor, client=None) -> bool:
    """Keep the buffer that aliases host tensor ``tensor``'s memory, as a resident input's is
    kept, so that every later call it is passed to, at any position, finds it instead of
    uploading (``to_buffers``); whether it was kept. Only where the buffer is the tensor's own
    memory (the CPU client, 64-byte aligned: ``aliases``), which sees every write to it: for a
    tensor rewritten in place and passed again call after call (a bucket's kept padding).

    Example::

        padded = torch.zeros(1, 2, 64, 32)
        keep_aliased(padded)       # True on the CPU client
    """
    client = client or get_client()
    if client.platform != "cpu" or type(tensor) is not _Tensor or not tensor.is_cpu \
            or tensor.requires_grad or tensor.data_ptr() % _ALIGNMENT \
            or not tensor.is_contiguous():
        return False
    to_buffer(tensor, True, client)
    return id(tensor) in _resident  # to_buffer keeps only a buffer that aliases


_storage_use_count = torch._C._storage_Use_Count


def adopt(tensor: torch.Tensor, buffer, result: torch.Tensor) -> bool:
    """Make host tensor ``tensor`` hold ``result`` (a DLPack view of program result ``buffer``,
    its new value) by taking ``result``'s memory, and keep ``buffer`` as its resident buffer:
    a compiled graph's input written in place (a static KV cache) then needs neither the copy
    of its whole new value into it after the call nor an upload at the next.

    Only where nothing can tell the memory moved: a plain CPU tensor on the CPU client, not
    requiring grad, contiguous, the whole of a storage that nothing else holds (no view, no
    numpy array, no other tensor: storage use counts tell; no DLPack capsule: the tensor's
    own use count), uploaded as resident from its own memory (``_whose_memory``: a
    ``from_numpy``, ``frombuffer``, ``from_file`` or ``share_memory_`` tensor shares its memory
    with something the counts do not see, which kept the old values). False (nothing done)
    otherwise; the caller copies as eager would.

    Example::

        if adopt(cache, out_buffer, new_cache):   # cache.data_ptr() == new_cache.data_ptr()
            new_cache = cache                     # aot_autograd's copy_ is then a no-op
    """
    key = id(tensor)
    entry = _resident.get(key)
    if entry is not None and entry[3] is _ADOPTED and entry[0]() is tensor and entry[1] == (
            tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype):
        # Adopted at the last call, its layout unchanged since (the steady decode step): only
        # a new holder of its memory (a view, a numpy array made since) would say no.
        if type(result) is not _Tensor or result.shape != tensor.shape or \
                result.dtype != tensor.dtype or tensor._use_count() != 1 or \
                _storage_use_count(tensor.untyped_storage()._cdata) != 2:
            return False
        tensor.set_(result)
        _resident[key] = (entry[0], (result.data_ptr(), *entry[1][1:]), buffer, _ADOPTED)
        return True
    if type(tensor) is not _Tensor or type(result) is not _Tensor or tensor.requires_grad \
            or not tensor.is_cpu or result.dtype != tensor.dtype \
            or result.shape != tensor.shape or not tensor.is_contiguous() \
            or not result.is_contiguous() or tensor.storage_offset():
        return False
    layout = (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype)
    # Holders of the storage we know: the tensor, the probe below, and the resident upload's
    # numpy view (``to_buffer``).
    if entry is None or entry[1] != layout or entry[0]() is not tensor or \
            entry[3] is not _OWN:
        return False
    storage = tensor.untyped_storage()
    if storage.nbytes() != result.nbytes or _storage_use_count(storage._cdata) != 3 or \
            tensor._use_count() != 1:
        return False
    del storage
    tensor.set_(result)
    _resident[key] = (entry[0], (result.data_ptr(), *layout[1:]), buffer, _ADOPTED)
    return True


_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
# The dtypes numpy views as they are (no reinterpreted bits, not complex): the one-step upload.
_NUMPY_VIEWABLE = frozenset({torch.float64, torch.float32, torch.float16, torch.int64,
                             torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool})


def to_buffers(tensors: list, plan, client) -> tuple[list, int, int]:
    """The buffers of one compiled call's inputs: for each ``(i, resident)`` of ``plan``, what
    ``to_buffer(tensors[i], resident or is a Parameter, client)`` gives; also the bytes and
    the count of the buffers made for this call alone, for ``memory.transient`` (they die
    with the call).

    The steady path of every compiled call, in one loop and no call per input: a resident
    weight (or any tensor whose aliasing buffer is kept: ``keep_aliased``) is a lookup, a plain
    host tensor (CPU, contiguous, no grad, a dtype numpy views)
    one numpy view and one device put; anything else goes through ``to_buffer``.

    Example::

        buffers, made, count = to_buffers([x, w], [(0, False), (1, True)], get_client())
    """
    device = client.device
    sharding = _shardings.get(device)
    if sharding is None:
        sharding = _sharding(device)
    buffers = []
    made = count = 0
    profiled = TORCH_PROFILER._is_profiler_enabled  # each upload its span: through upload()
    for i, resident in plan:
        tensor = tensors[i]
        cls = type(tensor)
        # type() is, not isinstance(): Parameter's metaclass makes isinstance ~1 us an arg.
        if cls is _Parameter:
            resident = True
        elif cls is not _Tensor:  # a device's own tensors, subclasses: the general path
            buffers.append(to_buffer(tensor, resident, client))
            continue
        # A kept buffer serves wherever its tensor is passed (a resident input's, or one
        # keep_aliased registered), while the tensor keeps that memory and layout.
        entry = _resident.get(id(tensor))
        if entry is not None and entry[0]() is tensor and entry[1] == (
                tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype):
            buffers.append(entry[2])
        elif resident:
            buffers.append(to_buffer(tensor, True, client))
        elif tensor.is_cpu and not tensor.requires_grad and tensor.dtype in _NUMPY_VIEWABLE \
                and tensor.is_contiguous() and not profiled:
            array = tensor.numpy()
            aval = _avals.get((array.shape, array.dtype))
            if aval is None:
                aval = _aval(array)
            try:  # free when nothing is raised (Python 3.11's zero-cost exceptions)
                buffers.append(_jax.batched_device_put(aval, sharding, [array], [device], True,
                                                       False, enable_x64=True))
            except _jax.JaxRuntimeError as exc:
                raise_if_out_of_memory(exc, f"copying argument {i} of shape {list(array.shape)} "
                                            f"to the device")
                raise
            made += array.nbytes
            count += 1
        else:
            buffers.append(upload(tensor, device))
    return buffers, made, count


def host_tensors(buffers: list, client) -> list:
    """Host tensors of ``buffers`` (``to_torch`` of each), in one loop: a compiled call's
    results. Zero-copy views on the CPU client.

    Example::

        [y] = host_tensors(executable.run([buf]), get_client())
    """
    if client.platform != "cpu" or TORCH_PROFILER._is_profiler_enabled:  # download spans
        return [to_torch(buffer, client) for buffer in buffers]
    tensors = []
    for buffer in buffers:
        tensors.append(_from_dlpack(_to_dlpack(buffer)))
    return tensors


_from_dlpack = torch._C._from_dlpack
_to_dlpack = _jax.buffer_to_dlpack_managed_tensor


def to_torch(buffer, client=None) -> torch.Tensor:
    """A torch CPU tensor viewing a PJRT buffer (zero-copy on the CPU client)."""
    if TORCH_PROFILER._is_profiler_enabled and not reentered():
        return around("torchtpu::download", to_torch, buffer, client, bytes=buffer.nbytes)
    if (client or get_client()).platform != "cpu":
        # Device memory is not host-addressable: copy to host first.
        import numpy as np
        array = np.asarray(buffer)
        if array.dtype.name == "bfloat16":  # numpy has no bf16: move the bits as int16
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(array)
    return _from_dlpack(_to_dlpack(buffer))


def resident_count() -> int:
    """How many tensors currently have a resident device buffer."""
    return len(_resident)
