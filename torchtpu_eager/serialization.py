"""``torch.save`` / ``torch.load`` of tpu tensors, keeping which tensors view one storage.

A tpu tensor pickles as a CUDA tensor does: PyTorch's ``_rebuild_tensor_v2`` of its view
(size, stride, offset) of its storage, the storage written as a host copy tagged with its
location ("tpu:0"). So a checkpoint saved from the device loads where torchtpu is not
installed, with ``map_location="cpu"`` (or a callable), as CUDA checkpoints do on CPU
machines, and under ``weights_only=True`` with nothing allowed beyond PyTorch's own. Within
one save the tensors of a storage share that host copy (``torch.save`` keeps it until the end),
so the file holds each storage once. Loading makes one tpu storage per saved storage (the
tag's deserializer, ``_restore_on_tpu``), and every tensor a view of it again; with
``map_location="cpu"`` the tensors are views of one CPU storage. Mutation through one is then
seen through the others, as after saving and loading CPU tensors. A tensor with Python
attributes of its own is rebuilt by ``rebuild_with_state`` (a torchtpu function: such files
need torchtpu to load).

``map_location="tpu"`` (or ``torch.device("tpu")``, ``{"cpu": "tpu"}``) puts tensors saved
from the host on the device, as ``map_location="cuda"`` does: a storage cannot live on the tpu
device, so the restored host storage says it is a tpu one (``_HostStorageForTpu``), PyTorch's
rebuild makes a tpu tensor and ``set_``s it to that storage, and the ``set_`` handler
(``storage_ops.py``) uploads the storage once for all the tensors that view it.

Example::

    x = torch.arange(5.0, device="tpu")
    torch.save({"x": x, "tail": x[1:]}, "f.pt")
    d = torch.load("f.pt")
    d["x"].add_(1)          # d["tail"] sees it
"""
from __future__ import annotations

import collections
import re
import sys
import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

# Storage -> (weak reference to the buffer copied, weak reference to its host copy): the host
# copy lives as long as a save holds it.
_saved: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Storage -> (weak reference to the buffer copied, weak reference to the tagged host storage).
_tagged: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Host copy (as unpickled) -> the tpu storage made from it, for the other tensors of one load.
_loaded = WeakIdKeyDictionary()


def _host_copy(storage) -> torch.Tensor:
    """The storage's contents on the host, the same tensor for every view saved together."""
    from . import modes, views
    from .transfer import download
    buffer = modes.concrete(views.storage_value(storage))
    known = _saved.get(storage)
    if known is not None and known[0]() is buffer:
        host = known[1]()
        if host is not None:
            return host
    host = download(buffer)
    _saved[storage] = (weakref.ref(buffer), weakref.ref(host))
    return host


class _SavedFromTpu(torch.UntypedStorage):
    """A tpu storage's host copy on its way into a file: its ``device`` says where it came
    from, so ``torch.save`` tags it with that location (``_location``) and copies it to the
    host (it is there already) to write it."""

    @property
    def device(self) -> torch.device:
        return self._tpu_device


def _location(storage) -> str | None:
    """The location tag of a storage saved from the device ("tpu:0"); None for any other."""
    return str(storage._tpu_device) if isinstance(storage, _SavedFromTpu) else None


def _tagged_storage(t) -> torch.UntypedStorage:
    """Tensor ``t``'s storage as a tagged host storage, one object per storage and contents,
    so that its views saved together write it once."""
    from . import modes, views
    buffer = modes.concrete(views.storage_value(t._st))
    known = _tagged.get(t._st)
    if known is not None and known[0]() is buffer:
        storage = known[1]()
        if storage is not None:
            return storage
    storage = _host_copy(t._st).untyped_storage()
    storage.__class__ = _SavedFromTpu
    storage._tpu_device = t.device
    _tagged[t._st] = (weakref.ref(buffer), weakref.ref(storage))
    return storage


def reduce(t):
    """``t.__reduce_ex__``: PyTorch's ``_rebuild_tensor_v2`` of a view of its storage, saved
    as a storage of the tpu device (module doc); made a Parameter again, as
    ``Parameter.__reduce_ex__`` does, if it was one."""
    # The Python attributes too, as eager's tensors and Parameters keep them (a flag a
    # library set on a weight came back without it).
    from .tensor import user_attributes
    state = user_attributes(t)
    if getattr(t, "_is_param", False):
        if state:
            return torch._utils._rebuild_parameter_with_state, (t.detach(), t.requires_grad,
                                                                 {}, state)
        return torch._utils._rebuild_parameter, (t.detach(), t.requires_grad, {})
    if state:
        return rebuild_with_state, (state, _host_copy(t._st), t.storage_offset(),
                                    tuple(t.shape), tuple(t.stride()), str(t.device),
                                    t.requires_grad)
    storage = torch.storage.TypedStorage(wrap_storage=_tagged_storage(t), dtype=t.dtype,
                                         _internal=True)
    return torch._utils._rebuild_tensor_v2, (storage, t.storage_offset(), tuple(t.shape),
                                             tuple(t.stride()), t.requires_grad,
                                             collections.OrderedDict())


def rebuild_with_state(state, *args) -> torch.Tensor:
    """``rebuild``, then the tensor's saved Python attributes set again."""
    out = rebuild(*args)
    torch._utils._set_obj_state(out, state)
    return out


def rebuild(host: torch.Tensor, offset: int, size: tuple, stride: tuple, device: str,
            requires_grad: bool) -> torch.Tensor:
    """A tensor viewing ``host`` (a storage's contents) as it was saved, on ``device`` or where
    ``torch.load``'s ``map_location`` sends it; views of one saved storage share one again.
    Files saved before tpu tensors were saved as CUDA's are rebuilt by it too."""
    from .tensor import TpuTensor
    target = _restore_target(device, host)
    if type(host) is TpuTensor:  # map_location sent the host copy itself to the device
        out = TpuTensor(host._st, size, stride, offset)
        if target.type != "tpu":
            out = out.to(target)
    elif target.type == "tpu":
        storage = _loaded.get(host)
        if storage is None:
            storage = _loaded[host] = _uploaded(host)
        out = TpuTensor(storage, size, stride, offset)
    else:
        out = host.as_strided(size, stride, offset)
        if target.type != "cpu":
            out = out.to(target)
    out.requires_grad_(requires_grad)
    return out


def _restore_target(device: str, host: torch.Tensor) -> torch.device:
    """Where ``torch.load``'s ``map_location`` sends a tensor saved on ``device``. A callable
    (CUDA checkpoints load on CPU machines with ``lambda storage, loc: storage``) is asked as
    torch.load asks it for every storage: with the saved location, and the device of the
    storage it returns, or ``device`` for None; PyTorch's own helper refuses any callable."""
    map_location = torch.serialization._serialization_tls.map_location
    if map_location is None and _legacy_loaded(host):
        # The legacy-format loader keeps it to itself: a file saved from tpu loaded on the
        # device whatever map_location said.
        frame = _legacy_load_frame()
        map_location = frame.f_locals.get("map_location") if frame is not None else None
    if isinstance(map_location, dict):
        return torch.device(map_location.get(device, device))
    if isinstance(map_location, (str, torch.device)):
        return torch.device(map_location)
    if map_location is None:
        return torch.device(device)
    restored = map_location(host.untyped_storage(), device)
    return torch.device(device) if restored is None else restored.device


class _ReadAfterUnpickling(torch.UntypedStorage):
    """A host storage of a legacy-format ``torch.load`` (``_use_new_zipfile_serialization=
    False``; every checkpoint before PyTorch 1.6): it unpickles every tensor first and reads
    the storages' bytes after, into storages it made uninitialized. Uploading at rebuild
    loaded garbage (an int64 5 came back as 139656630836544); the tpu storages made from this
    one meanwhile are filled when it is read."""

    def _set_from_file(self, *args, **kwargs):
        out = super()._set_from_file(*args, **kwargs)
        self._tpu_read = True
        from .transfer import upload
        for storage, host in self.__dict__.pop("_tpu_pending", ()):
            storage.value = upload(host)
        return out


class _HostStorageForTpu(_ReadAfterUnpickling):
    """A storage ``torch.load`` restored for the tpu device: its bytes are on the host, its
    ``device`` says tpu, so PyTorch's ``_rebuild_tensor`` makes a tpu tensor for it."""

    @property
    def device(self) -> torch.device:
        return self._tpu_device


# data_ptr of a restored host storage -> [weak reference to it, its tpu Storage per dtype]
_restored: dict = {}


def _restore_on_tpu(storage, location: str):
    """The deserializer of location "tpu[:n]" (``torch.load(..., map_location="tpu")``).

    The storage stays on the host, marked for the device; ``device_storage`` uploads it when
    PyTorch's rebuild sets a tpu tensor to it.
    """
    if not re.fullmatch(r"tpu(:\d+)?", location):
        return None
    from .device import check_device
    device = torch.device(location)
    check_device(device)
    storage.__class__ = _HostStorageForTpu
    storage._tpu_device = torch.device("tpu", device.index or 0)
    if storage.nbytes():
        for key in [k for k, (ref, _) in _restored.items() if ref() is None]:
            del _restored[key]
        _restored[storage.data_ptr()] = [weakref.ref(storage), {}]
    return storage


def device_storage(storage, dtype: torch.dtype):
    """The tpu ``Storage`` of a host storage ``torch.load`` restored for the device (one per
    storage and dtype, shared by every tensor that views it), or None for any other storage.

    Example::

        device_storage(t.untyped_storage(), torch.float32)   # None: not a restored storage
    """
    if not storage.nbytes():  # a restored empty storage has no address to know it by
        return _uploaded(torch.empty(0, dtype=dtype)) if _cpu(storage) else None
    known = _restored.get(storage.data_ptr())
    if known is None or known[0]() is None or known[0]().nbytes() != storage.nbytes():
        return None
    made = known[1].get(dtype)
    if made is None:
        host = torch.empty(0, dtype=torch.uint8).set_(storage).view(dtype)
        made = known[1][dtype] = _uploaded(host)
    return made


def _cpu(storage) -> bool:
    return torch._C.StorageBase.device.__get__(storage).type == "cpu"  # not what it says


def _uploaded(host: torch.Tensor):
    """A tpu ``Storage`` holding ``host``'s contents (a 1-d host tensor: a storage's elements),
    or to hold them once a legacy-format load has read them (``_ReadAfterUnpickling``)."""
    from .storage import Storage
    from .transfer import upload
    source = host.untyped_storage()
    if getattr(source, "_torch_load_uninitialized", False) and \
            not getattr(source, "_tpu_read", False) and _in_legacy_load():
        storage = Storage(None, tuple(host.shape), host.dtype, host.numel())
        if type(source) is torch.UntypedStorage:
            source.__class__ = _ReadAfterUnpickling
        source.__dict__.setdefault("_tpu_pending", []).append((storage, host))
        return storage
    return Storage(upload(host), tuple(host.shape), host.dtype, host.numel())


def register() -> None:
    """Let ``torch.load(weights_only=True)`` (its default) call ``rebuild`` (earlier files'
    format) and ``rebuild_with_state``; tag storages saved from the device with their location,
    and restore them there, as ``map_location="tpu"`` restores host ones (before PyTorch's
    PrivateUse1 deserializer)."""
    torch.serialization.add_safe_globals([rebuild, rebuild_with_state])
    torch.serialization.register_package(15, _location, _restore_on_tpu)


def _legacy_loaded(host: torch.Tensor) -> bool:
    """Whether ``host`` may come from a legacy-format load (its storages carry the loader's
    flag; a host copy already on the device came through its ``map_location``): only then is
    the stack worth walking for the loader's frame."""
    return type(host) is not torch.Tensor or \
        getattr(host.untyped_storage(), "_torch_load_uninitialized", False)


def _in_legacy_load() -> bool:
    """Whether a legacy-format ``torch.load`` is unpickling now, its storages still to be
    read. The flag it leaves on every storage does not tell: ``pickle.loads`` of a tpu tensor
    gets its host copy from a nested legacy load (``TypedStorage.__reduce__``) that has read it
    already, and waiting for a read that never came loaded zeros."""
    return _legacy_load_frame() is not None


def _legacy_load_frame():
    """The frame of the legacy-format ``torch.load`` running now, or None."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _LEGACY_LOAD:
            return frame
        frame = frame.f_back
    return None


_LEGACY_LOAD = torch.serialization._legacy_load.__code__
