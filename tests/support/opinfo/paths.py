"""The two paths an OpInfo sample runs on, each a function ``run(fn, args, kwargs) -> Outcome``.

- ``compile``: ``torch.compile(fn, backend="torchtpu", dynamic=False)`` after a Dynamo reset;
  the outcome names every op that fell back to eager PyTorch and every Dynamo graph break.
- ``eager``: the inputs moved to device ``"tpu"``, the op run there in strict mode (each op its
  own program), the results brought back.
- ``fuse``: the same in defer-and-fuse mode: the ops are recorded and run as one spliced program
  when the results (and gradients) are brought back, the mode restored afterwards.
  Until ``torchtpu_eager`` provides the device, ``unavailable()`` says why not for both, and the
  harness skips with that reason.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import re
from dataclasses import dataclass, field

import torch
import torch._dynamo
from torch.utils._pytree import tree_map

from ..helpers import eager_mode
from .skips import ON_DEVICE  # the paths whose inputs (and modules) move to the device

EAGER_UNAVAILABLE = "eager tpu device not available yet"


@dataclass
class Outcome:
    """What one sample returned on a path and what it used other than XLA."""
    value: object
    fallbacks: dict = field(default_factory=dict)     # op name -> reason it ran in eager
    graph_breaks: list = field(default_factory=list)  # Dynamo's reasons
    graphs: int = 0                                   # graphs the backend was handed
    arguments: object = None                          # (args, kwargs) after the call, on CPU


class _CountingBackend:
    """A registered backend ("torchtpu" unless said), counting the graphs Dynamo hands it."""

    def __init__(self, name: str = "torchtpu"):
        self.graphs = 0
        self.backend = torch._dynamo.lookup_backend(name)

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return self.backend(gm, example_inputs)


class _FallbackLog(logging.Handler):
    """Captures the "X runs in eager PyTorch, not XLA: reason" warnings of the backend (and
    "X runs on the host, not the tpu device: reason" of the eager device).

    The backend warns once per op and process; the harness forgets which ops it warned about
    before each sample so that every sample names its own fallbacks' reasons.
    """

    def __init__(self):
        super().__init__(logging.WARNING)
        self.reasons: dict = {}

    def emit(self, record):
        message = record.getMessage()
        match = re.match(r"torchtpu: (\S+?)\(.*(?:runs in eager PyTorch, not XLA|runs on the "
                         r"host, not the tpu device): (.*)", message, re.S)
        if match:
            self.reasons.setdefault(match.group(1), match.group(2).strip())


@contextlib.contextmanager
def _capture_fallbacks():
    from torchtpu_compile import _logging
    handler = _FallbackLog()
    _logging._warned.clear()
    saved = _logging.log.propagate
    _logging.log.addHandler(handler)
    _logging.log.propagate = False  # the outcome carries the reasons; keep stderr quiet
    try:
        yield handler.reasons
    finally:
        _logging.log.removeHandler(handler)
        _logging.log.propagate = saved


def run_compiled(fn, args, kwargs, then=None, backend: str = "torchtpu") -> Outcome:
    """Run ``fn(*args, **kwargs)`` through ``torch.compile(backend="torchtpu")``; ``then``, if
    given, maps ``(result, args, kwargs)`` to the value inside the same capture of fallbacks (a
    backward pass, whose program aot_autograd builds on first use). ``backend="eager"`` runs
    Dynamo alone: what Dynamo itself does with the call (the error sweep's bar).

    Example::

        out = run_compiled(torch.add, (torch.ones(2), torch.ones(2)), {})
        out.value, out.fallbacks   # tensor([2., 2.]), {}
    """
    import torchtpu_compile
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torchtpu_compile.reset_stats()
    counting = _CountingBackend(backend)

    def call(*a, **k):
        return fn(*a, **k)

    compiled = torch.compile(call, backend=counting, dynamic=False, fullgraph=False)
    with _capture_fallbacks() as reasons:
        value = compiled(*args, **kwargs)
        if then is not None:
            value = then(value, args, kwargs)
    counted = torchtpu_compile.stats()["fallback_ops"]
    fallbacks = {op: reasons.get(op, "no reason logged") for op in counted}
    breaks = [str(reason) for reason in counters["graph_break"]]
    torch._dynamo.reset()
    return Outcome(value, fallbacks, breaks, counting.graphs, (args, kwargs))


def eager_available() -> str | None:
    """None when the ``tpu`` device works, else why not (the harness skips with it)."""
    try:
        import torchtpu_eager  # noqa: F401  (registers the device)
        torch.empty(1, device="tpu").cpu()
    except Exception:  # not built yet, or broken: both mean the path cannot run
        return EAGER_UNAVAILABLE
    return None


def _is_leaf(value) -> bool:
    """A PackedSequence moves whole: its ``batch_sizes`` stay on the CPU wherever it goes."""
    return isinstance(value, torch.nn.utils.rnn.PackedSequence)


def _to(device):
    def move(value):
        if isinstance(value, torch.Size):  # a tuple to pytree: kept whole, it holds no tensor
            return value
        if _is_leaf(value):
            return value.to(device)
        if isinstance(value, torch.Tensor):
            return value.detach().to(device).requires_grad_(value.requires_grad)
        return value
    return move


def run_eager(fn, args, kwargs, then=None, mode: str = "strict") -> Outcome:
    """Run ``fn`` on device ``"tpu"`` in eager ``mode``: inputs moved there, results moved back
    to the CPU (in defer-and-fuse mode, that is the materialization point that runs the
    recording); ``then``, if given, maps ``(result, args, kwargs)`` on the device before the
    value moves back (a backward pass).

    Example::

        run_eager(torch.add, (torch.ones(2), torch.ones(2)), {}).value   # tensor([2., 2.])
        run_eager(torch.add, (torch.ones(2), torch.ones(2)), {}, mode="defer_and_fuse")
    """
    import torchtpu_compile
    torchtpu_compile.reset_stats()  # the eager device counts its host fallbacks there too
    args, kwargs = tree_map(_to("tpu"), (args, kwargs), is_leaf=_is_leaf)
    with _capture_fallbacks() as reasons, eager_mode(mode):
        value = fn(*args, **kwargs)
        if then is not None:
            value = then(value, args, kwargs)
        value = value if isinstance(value, torch.Size) else \
            tree_map(_to("cpu"), value, is_leaf=_is_leaf)
        arguments = tree_map(_to("cpu"), (args, kwargs), is_leaf=_is_leaf)
    counted = torchtpu_compile.stats()["fallback_ops"]
    return Outcome(value, {op: reasons.get(op, "no reason logged") for op in counted},
                   arguments=arguments)


PATHS = {"compile": run_compiled, "eager": run_eager,
         "fuse": functools.partial(run_eager, mode="defer_and_fuse"),
         # PyTorch's own compiler, for comparison only (the unsupported-dtype sweep's)
         "inductor": functools.partial(run_compiled, backend="inductor")}


def unavailable(path: str) -> str | None:
    """Why ``path`` cannot run here, or None."""
    return eager_available() if path in ON_DEVICE else None
