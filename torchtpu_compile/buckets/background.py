"""Compile a graph's next larger bucket ahead, on a background thread
(``config.background_buckets``).

Once a graph has a bucket, a longer input later would stall on compiling the next one. The
caller's thread traces and lowers the next bucket right away (FX tracing sets process-wide
flags that a second thread would trip over); only the XLA compile, the long part, runs here,
on one worker thread per process. Its program's executable is a ``CompilingAhead`` until then:
the first run waits for the compile, or does it on the spot if the worker has not started it,
so a bucket is compiled exactly once, and the program is the one the caller would have
built: results do not change. The executable cache has its own lock: the worker and the
caller never race on it.

At exit, compiles not started are dropped and the one running is waited for (up to
``_EXIT_WAIT_SECONDS``), so none is cut in the middle of writing a cache entry.

Example::

    program = build_program(gm, precision="highest", name="g[bucket 16]",
                            compile=compile_ahead)   # returns now; XLA compiles meanwhile
    wait_idle()                                      # tests: until every compile has finished
"""
from __future__ import annotations

import atexit
import queue
import threading

from .._logging import log

_EXIT_WAIT_SECONDS = 120

_jobs: queue.Queue = queue.Queue()
_worker: threading.Thread | None = None
_worker_lock = threading.Lock()
_stopping = threading.Event()


class CompilingAhead:
    """An executable being compiled on the worker; ``run`` waits for it (or compiles it, if
    the worker has not begun), then forwards every later call straight to it."""

    def __init__(self, compile_fn):
        self._compile_fn = compile_fn
        self._claimed = threading.Lock()   # whoever takes it compiles
        self._done = threading.Event()
        self._executable = None
        self._error: BaseException | None = None

    def compile_unless_claimed(self) -> None:
        if not self._claimed.acquire(blocking=False):
            return
        try:
            self._executable = self._compile_fn()
        except BaseException as exc:  # raised to the caller at its first run
            self._error = exc
            log.debug("torchtpu: background bucket compile failed: %s", exc)
        finally:
            self._compile_fn = None
            self._done.set()

    def wait(self):
        """The compiled executable, once there (compiled here if nobody started it)."""
        self.compile_unless_claimed()
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._executable

    def run(self, buffers: list) -> list:
        executable = self.wait()
        self.run = executable.run  # later calls skip this wrapper
        return executable.run(buffers)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.wait(), name)


def compile_ahead(stablehlo, *, precision: str, name: str, **convention):
    """``run.compile_program``'s counterpart for ``build_program(compile=...)``: the
    ``Program`` now, its XLA compile on the background worker."""
    from ..program.run import Program, compile_program

    pending = CompilingAhead(
        lambda: compile_program(stablehlo, precision=precision, name=name).executable)
    _schedule(pending.compile_unless_claimed)
    return Program(pending, name=name, lowered=stablehlo, **convention)


def _loop() -> None:
    while True:
        job = _jobs.get()
        try:
            if job is not None and not _stopping.is_set():
                job()
        finally:
            _jobs.task_done()
        if job is None:
            return


def _schedule(job) -> None:
    global _worker
    if _stopping.is_set():
        return  # at exit: the program compiles at its first run, if there is one
    with _worker_lock:
        if _worker is None:
            _worker = threading.Thread(target=_loop, daemon=True, name="torchtpu-buckets")
            _worker.start()
            atexit.register(_stop)
    _jobs.put(job)


def wait_idle(timeout: float | None = None) -> bool:
    """Wait until every scheduled compile has finished; False if ``timeout`` passed first."""
    with _jobs.all_tasks_done:
        return _jobs.all_tasks_done.wait_for(lambda: not _jobs.unfinished_tasks, timeout)


def _stop() -> None:
    _stopping.set()
    try:  # drop what has not started
        while True:
            _jobs.get_nowait()
            _jobs.task_done()
    except queue.Empty:
        pass
    _jobs.put(None)
    if _worker is not None:
        _worker.join(_EXIT_WAIT_SECONDS)
