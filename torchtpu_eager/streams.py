"""``torch.tpu.Stream`` / ``Event``: the stream API of ``torch.cuda``, with the tpu's semantics.

The tpu device runs each process's programs in the order they were issued (one PJRT device,
one queue; the host waits only for values), so there is one stream of execution. A
``Stream`` is therefore an ordering no-op: work issued "on" any stream runs in issue order,
which already satisfies every ``wait_stream`` / ``wait_event``, and ``record_stream`` has
nothing to protect (a buffer lives as long as a tensor references it). What must be real is
waiting: ``synchronize()`` on a stream or event blocks the host until the device work issued
so far has finished (``torch.tpu.synchronize``), and ``query()`` says whether it has.
FSDP2 and DDP use exactly this API (streams for overlap, events to order them).

Example::

    s = torch.tpu.Stream()
    with torch.tpu.stream(s):
        y = x * 2
    torch.tpu.current_stream().wait_stream(s)
    done = torch.tpu.Event(enable_timing=True)
    done.record()
    done.synchronize()          # y is computed
"""
from __future__ import annotations

import threading

import torch

from . import storage as _storage


def synchronize_device() -> None:
    """Block until every queued op has finished (pending deferred ops run first).

    Example::

        synchronize_device()        # what torch.tpu.synchronize() does
    """
    from torchtpu_compile import index_errors
    from torchtpu_compile.runtime import transfer

    from . import modes
    modes.current().flush()
    transfer.wait_uploads()  # non_blocking uploads, their tensors dead or alive
    for st in _storage.live_storages():
        value = st.value
        if value is not None and hasattr(value, "block_until_ready"):
            value.block_until_ready()
    index_errors.raise_pending()  # an index out of range in an op that ran: raised here


def device_idle() -> bool:
    """Whether every buffer issued so far is computed (deferred ops not yet run: no).

    Example::

        if not device_idle(): synchronize_device()
    """
    from torchtpu_compile.runtime import transfer
    if not transfer.uploads_done():
        return False
    for st in _storage.live_storages():
        value = st.value
        if type(value).__name__ == "Lazy":
            return False
        is_ready = getattr(value, "is_ready", None)
        if is_ready is not None and not is_ready():
            return False
    return True


class Stream(torch.Stream):
    """A tpu stream: an ordering no-op over the device's single in-order queue (module doc).

    Example::

        s = torch.tpu.Stream(priority=-1)
        s.wait_stream(torch.tpu.current_stream())
    """

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        stream = super().__new__(cls, device="tpu", priority=priority)
        stream.priority = priority   # torch.Stream keeps none; CUDA's stream reports it
        return stream

    def wait_stream(self, stream) -> None:
        pass  # issue order is execution order

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        return device_idle()

    def synchronize(self) -> None:
        synchronize_device()

    def __repr__(self) -> str:
        return f"<torch.tpu.Stream device=tpu:0 priority={self.priority}>"


class _TpuEvents(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch.Event) and obj.device.type == "tpu"


class Event(metaclass=_TpuEvents):
    """A marker in the tpu queue; ``synchronize()`` blocks until the work before it is done.
    ``torch.tpu.Event(...)`` is ``torch.Event(device="tpu", ...)``, with ``torch.cuda.Event``'s
    arguments; the device guard (``csrc/native.cpp``) records, queries, synchronizes and times
    it. A plain ``torch.Event``, not a subclass: PyTorch's ``elapsed_time`` takes no subclass.

    With ``enable_timing=True``, ``record()`` waits for the device first, so ``elapsed_time``
    measures finished work (the host cannot timestamp the device queue without waiting).

    Example::

        start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
        start.record(); y = x @ x; end.record()
        ms = start.elapsed_time(end)
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False, **kwargs):
        return torch.Event(device="tpu", enable_timing=enable_timing, blocking=blocking,
                           interprocess=interprocess)


_local = threading.local()
_default = None


def default_stream(device=None) -> Stream:
    """The stream work is issued on outside any ``torch.tpu.stream`` context.

    Example::

        torch.tpu.default_stream().synchronize()
    """
    global _default
    if _default is None:
        _default = Stream()
    return _default


def current_stream(device=None) -> Stream:
    """The stream of ``with torch.tpu.stream(s)`` on this thread, else the default one.

    Example::

        torch.tpu.current_stream().wait_event(event)
    """
    return getattr(_local, "stream", None) or default_stream()


def set_stream(stream) -> None:
    """Make ``stream`` this thread's current stream (``torch.tpu.stream`` restores it after).

    Example::

        torch.tpu.set_stream(torch.tpu.Stream())
    """
    _local.stream = stream


class StreamContext:
    """``with torch.tpu.stream(s):`` makes ``s`` the current stream of this thread."""

    def __init__(self, stream):
        self.stream = stream
        self._previous = None

    def __enter__(self):
        self._previous = getattr(_local, "stream", None)
        if self.stream is not None:
            _local.stream = self.stream
        return self.stream

    def __exit__(self, *exc) -> None:
        _local.stream = self._previous


def stream(stream) -> StreamContext:
    """Context manager selecting ``stream`` (None: no change), as ``torch.cuda.stream``.

    Example::

        with torch.tpu.stream(torch.tpu.Stream()):
            y = x + 1
    """
    return StreamContext(stream)
