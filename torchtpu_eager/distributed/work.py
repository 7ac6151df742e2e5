"""``StagedWork``: the handle of a collective in flight, finished on the caller's thread; and
the errors of collectives that fail (``collective_error``, ``gone_peers_error``).

The transport (gloo on host copies) runs the collective on its own threads; copying results
back onto the tpu device happens in ``wait()`` (or ``get_future()``, which DDP's reducer
calls), on the thread that waits, because the eager device is driven from one thread.

A collective that fails raises ``torch.distributed.DistBackendError`` (as NCCL's do), naming
the ranks whose processes have ended (``pjrt_world.gone``) when that is the cause.

Example::

    work = dist.all_reduce(x, async_op=True)   # a StagedWork
    work.wait()                                # x now holds the sum
"""
from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist
from torch.futures import Future

from . import pjrt_world

#: How long a failed collective waits for the news of a peer that ended (its lifeline
#: closes about when its connections do) to name it in the error.
_NEWS_WAIT_S = 1.0


def gone_peers_error(what: str, processes=None) -> dist.DistBackendError | None:
    """The error for running ``what`` when a rank of ``processes`` (world ranks; None: any)
    has ended, or None while all live.

    Example::

        error = gone_peers_error("all_reduce", (0, 1))
        if error is not None:
            raise error     # "tpu_dist: all_reduce: rank 0 died (...)"
    """
    gone = pjrt_world.gone(processes)
    if not gone:
        return None
    said = []
    for rank, how in sorted(gone.items()):
        if rank == -1:
            said.append("the coordinator process of the PJRT world is gone")
        elif how == "exited":
            said.append(f"rank {rank} exited")
        else:
            said.append(f"rank {rank} died (its process ended without exiting: killed or "
                        f"crashed)")
    return dist.DistBackendError(
        f"tpu_dist: {what}: {'; '.join(said)}. The group cannot run collectives with it any "
        f"more: save what you need, call torch.distributed.destroy_process_group() and exit "
        f"(or restart the job)")


def collective_error(what: str, exc: BaseException) -> dist.DistBackendError:
    """The error a collective that failed with ``exc`` raises: DistBackendError (as NCCL's
    failures are), naming the ranks whose processes have ended when any have."""
    deadline = time.monotonic() + _NEWS_WAIT_S
    error = gone_peers_error(what)
    while error is None and pjrt_world.watched() and time.monotonic() < deadline:
        time.sleep(0.05)
        error = gone_peers_error(what)
    cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if error is not None:
        return dist.DistBackendError(f"{error} (the transport said: {cause})")
    return dist.DistBackendError(f"tpu_dist: {what} failed: {cause}")


def eager_only(cls):
    """Keep Dynamo out of a class's methods: a compiled caller (DDP's forward under
    torch.compile) must break its graph at a collective call, as it does at gloo's or NCCL's
    C++ methods, not trace our staging code."""
    for name, fn in list(vars(cls).items()):
        if callable(fn) and not name.startswith("__"):
            setattr(cls, name, torch._disable_dynamo(fn, recursive=True))
    return cls


@eager_only
class _Work(dist.Work):
    """What every tpu_dist work handle shares: ``_result``, ``_error`` and ``wait()``."""

    def exception(self):
        return self._error

    def get_future(self) -> Future:
        # DDP's reducer chains on this future; results must be on the device when it
        # completes, so finish first.
        self.wait()
        future = Future()
        future.set_result(self._result)
        return future

    def synchronize(self) -> None:
        self.wait()


@eager_only
class StagedWork(_Work):
    """A collective: ``inner`` (a transport Work, or None) then ``finish()``; value ``result``."""

    def __init__(self, inner, finish, result):
        super().__init__()
        self._inner = inner
        self._finish = finish
        self._result = result
        self._done = False
        self._error = None
        self._lock = threading.Lock()

    def wait(self, timeout=None) -> bool:
        with self._lock:
            if self._error is not None:
                raise self._error
            if self._done:
                return True
            try:
                if self._inner is not None:
                    # Raises on a peer that died or on the group's timeout: never hangs.
                    if timeout is None:
                        self._inner.wait()
                    else:
                        self._inner.wait(timeout)
                if self._finish is not None:
                    self._finish()
            except Exception as exc:
                self._error = collective_error("collective", exc)
                raise self._error from exc
            self._done = True
            return True

    def is_completed(self) -> bool:
        if self._done:
            return True
        if self._inner is None or self._inner.is_completed():
            self.wait()
            return True
        return False

    def is_success(self) -> bool:
        return self._done and self._error is None


def done(result) -> StagedWork:
    """A work handle that is already complete (collectives finished synchronously)."""
    work = StagedWork(None, None, result)
    work._done = True
    return work


@eager_only
class PjrtWork(_Work):
    """A collective run by the PJRT client: its results are in the tensors already (as
    pending device buffers, ordered before any later op on them); ``wait()`` blocks until the
    buffers are ready, and raises the transport's error (a peer that died) if there was one."""

    def __init__(self, buffers, result):
        super().__init__()
        self._buffers = buffers
        self._result = result
        self._error = None

    def wait(self, timeout=None) -> bool:
        if self._error is not None:
            raise self._error
        try:
            for buffer in self._buffers:
                buffer.block_until_ready()
        except Exception as exc:
            self._error = collective_error("collective", exc)
            raise self._error from exc
        self._buffers = ()
        return True

    def is_completed(self) -> bool:
        return all(b.is_ready() for b in self._buffers)

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

