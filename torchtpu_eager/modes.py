"""How the eager device runs ops: strict, debug or defer-and-fuse.

- strict (default): each op is dispatched as its own compiled program, asynchronously; the
  host waits only where a value is needed (``.cpu()``, ``.item()``, print).
- debug (``TORCH_TPU_LAUNCH_BLOCKING=1``): the same, but each op waits for its results, so an
  error is raised at the op that caused it, with that op's Python stack.
- defer-and-fuse (``TORCH_TPU_DEFER_AND_FUSE=1``): ops are recorded and compiled as one program
  at the next materialization point (see ``fuse.py``).

Example::

    torch.tpu.set_eager_mode("defer_and_fuse")
    y = model(x)            # recorded
    print(y.sum().item())   # one program runs here
"""
from __future__ import annotations

from torchtpu_compile import config
from torchtpu_compile.index_errors import caller_location, raise_pending

MODES = ("strict", "debug", "defer_and_fuse")


def pending(value) -> bool:
    """Whether ``value`` is a deferred graph's value not computed yet."""
    return type(value).__name__ == "Lazy" and value.buffer is None


def concrete(value):
    """A PJRT buffer for ``value``, running a deferred graph if it is still pending."""
    if type(value).__name__ == "Lazy":
        return value.resolve()
    return value


class Strict:
    """Run each op now (asynchronously: PJRT returns before the computation finishes)."""

    name = "strict"
    #: Whether a gather of part of a computed buffer runs as a program of its own rather than
    #: in its op's (``views._apart``): not here, where every op runs now and a folded read is
    #: a program less.
    reads_apart = False

    def apply(self, graph, values: list, cut: bool = True) -> list:
        """Run ``graph`` on ``values``; ``cut`` is defer-and-fuse mode's (``fuse.py``)."""
        return graph.run([concrete(v) for v in values],
                         caller_location() if graph.checked else None)

    def check(self, graph) -> None:
        """Compile a newly traced op now, so an op that does not lower falls back at once."""
        graph.program()

    def note_write(self, storage) -> None:
        pass

    def flush(self) -> None:
        pass


class Debug(Strict):
    """Run each op now and wait for it: errors surface at the op that caused them."""

    name = "debug"

    def apply(self, graph, values: list, cut: bool = True) -> list:
        try:
            outputs = graph.run([concrete(v) for v in values],
                                caller_location() if graph.checked else None)
            for buffer in outputs:
                buffer.block_until_ready()
        except Exception as exc:
            # Raised here, inside the op's own dispatch: the traceback is the op's Python stack.
            raise RuntimeError(f"tpu (TORCH_TPU_LAUNCH_BLOCKING=1): {graph.label} failed on "
                               f"the device: {exc}") from exc
        raise_pending(at_op=True)  # an index out of range: eager's error, at the op itself
        return outputs


def _from_environment():
    blocking, deferred = config.launch_blocking, config.defer_and_fuse
    if blocking and deferred:
        raise RuntimeError("TORCH_TPU_LAUNCH_BLOCKING=1 and TORCH_TPU_DEFER_AND_FUSE=1 cannot be "
                           "combined: debug mode runs each op alone. Unset one of them.")
    if deferred:
        from .fuse import DeferAndFuse
        return DeferAndFuse()
    return Debug() if blocking else Strict()


_current = None


def current():
    """The executor of the current mode."""
    global _current
    if _current is None:
        _current = _from_environment()
    return _current


def set_eager_mode(mode: str) -> None:
    """Switch modes: "strict", "debug" or "defer_and_fuse". Pending deferred ops run first.

    Example::

        torch.tpu.set_eager_mode("debug")
    """
    global _current
    if mode not in MODES:
        raise ValueError(f"unknown tpu eager mode {mode!r}; choose one of {', '.join(MODES)}")
    previous = current()
    previous.flush()
    if mode == "defer_and_fuse":
        from .fuse import DeferAndFuse
        _current = DeferAndFuse()
    else:
        _current = Debug() if mode == "debug" else Strict()


def get_eager_mode() -> str:
    return current().name
