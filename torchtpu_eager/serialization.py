"""``torch.save`` / ``torch.load`` of tpu tensors, keeping which tensors view one storage.

A tpu tensor pickles as its view (size, stride, offset) of a host copy of its whole storage.
Within one save the tensors of a storage share that host copy (the pickler keeps it, so the
next tensor of the storage finds it), so the file holds each storage once, as it does for CPU
tensors. Loading makes one tpu storage per host copy, and every tensor a view of it again; with
``map_location="cpu"`` the tensors are views of one CPU storage. Mutation through one is then
seen through the others, as after saving and loading CPU tensors.

Example::

    x = torch.arange(5.0, device="tpu")
    torch.save({"x": x, "tail": x[1:]}, "f.pt")
    d = torch.load("f.pt")
    d["x"].add_(1)          # d["tail"] sees it
"""
from __future__ import annotations

import re
import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

# Storage -> (weak reference to the buffer copied, weak reference to its host copy): the host
# copy lives as long as a save holds it.
_saved: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
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


def reduce(t):
    """``t.__reduce_ex__``: rebuilt by ``rebuild`` as a view of its storage's host copy (and
    made a Parameter again, as ``Parameter.__reduce_ex__`` does, if it was one)."""
    if getattr(t, "_is_param", False):
        return torch._utils._rebuild_parameter, (t.detach(), t.requires_grad, {})
    return rebuild, (_host_copy(t._st), t.storage_offset(), tuple(t.shape), tuple(t.stride()),
                     str(t.device), t.requires_grad)


def rebuild(host: torch.Tensor, offset: int, size: tuple, stride: tuple, device: str,
            requires_grad: bool) -> torch.Tensor:
    """A tensor viewing ``host`` (a storage's contents) as it was saved, on ``device`` or where
    ``torch.load``'s ``map_location`` sends it; views of one saved storage share one again."""
    target = torch.device(torch._utils._get_restore_location(device))
    if target.type == "tpu":
        from .storage import Storage
        from .tensor import TpuTensor
        from .transfer import upload
        storage = _loaded.get(host)
        if storage is None:
            storage = _loaded[host] = Storage(upload(host), tuple(host.shape), host.dtype,
                                              host.numel())
        out = TpuTensor(storage, size, stride, offset)
    else:
        out = host.as_strided(size, stride, offset)
        if target.type != "cpu":
            out = out.to(target)
    out.requires_grad_(requires_grad)
    return out


def _restore_on_host(storage, location: str):
    """The deserializer of location "tpu" (``torch.load(..., map_location="tpu")``).

    A storage cannot live on the tpu device (PyTorch would allocate one and crash): it stays on
    the host. A tpu tensor's host copy goes on to ``rebuild``, which puts it on the device; a
    tensor saved from the host stays there, which the warning says, with what to do instead.
    """
    if not re.fullmatch(r"tpu(:\d+)?", location):
        return None
    from torchtpu_compile._logging import warn_once
    warn_once(("map_location", "tpu"),
              "torchtpu: torch.load(map_location='tpu'): tensors saved from the tpu device load "
              "on it, tensors saved from the host stay on the host (a tpu tensor has no storage "
              "to load them into). Move those with .to('tpu'), or load_state_dict them into a "
              "model on the tpu device.")
    return storage


def register() -> None:
    """Let ``torch.load(weights_only=True)`` (its default) call ``rebuild``, and
    ``map_location="tpu"`` restore storages (before PyTorch's PrivateUse1 deserializer)."""
    torch.serialization.add_safe_globals([rebuild])
    torch.serialization.register_package(15, lambda storage: None, _restore_on_host)
