"""Graph breaks: code torch.compile leaves to eager Python between our graphs, made visible.

Dynamo breaks a graph where it cannot trace (``masked_select``'s data-dependent shape without
``capture_dynamic_output_shape_ops``, ``.item()``, ``print``, unsupported Python). The code at
the break runs in eager PyTorch (on the host, for CPU tensors) and the backend never sees it, so
neither the fallback counters nor strict mode knew. Dynamo reports every break it resumes from,
or skips a frame for, through ``InstructionTranslatorBase.log_graph_break`` (what
``TORCH_LOGS=graph_breaks`` prints); ``install`` wraps it, for frames compiled with
``backend="torchtpu"`` only:

- strict (``TORCHTPU_STRICT=1``): ``GraphBreakError`` naming the reason and the user's line,
  raised while Dynamo traces, before any of the frame runs (``fullgraph=True``'s error, with
  ours). Except at ``torch.autograd.grad`` and ``Tensor.backward()``: the code at those breaks
  is the autograd engine running the backward graphs the backend compiled, nothing else;
- otherwise (and at those): counted in ``stats()["graph_breaks"]`` (reason -> breaks traced)
  and warned about once per reason and line; a break at a ``logging.Logger`` call (Hugging
  Face models' ``logger.warning_once``) is counted and logged at INFO only, since the code
  there is the logging call and no tensor work (Inductor is silent there too).

Example::

    f = torch.compile(lambda x: torch.masked_select(x, x > 0).sum(), backend="torchtpu")
    f(torch.randn(4))
    torchtpu_compile.stats()["graph_breaks"]
    # {"Dynamic shape operator: Operator `aten.masked_select.default`'s output shape ...": 1}
"""
from __future__ import annotations

from torch._dynamo.exc import TorchRuntimeError

from . import config, counters
from ._logging import info_once, warn_once
from .errors import UnsupportedOpError


class GraphBreakError(UnsupportedOpError, TorchRuntimeError):
    """A graph break under ``TORCHTPU_STRICT=1``.

    Also a Dynamo ``TorchRuntimeError``: Dynamo hands those to the caller as they are, where
    it would answer an ``Unsupported`` by running the whole frame in eager Python.
    """


#: Dynamo's graph break types (its graph_break_registry.json) whose eager code is autograd
#: running our compiled backward graphs: allowed under strict.
_AUTOGRAD_BREAKS = frozenset({
    "using `torch.autograd.grad` with `torch._dynamo.config.trace_autograd_ops=False`",
    "Unsupported Tensor.backward() call",
})

#: Breaks whose eager code is a logging call: counted, but not warned about.
_LOGGING_BREAKS = frozenset({
    "logging.Logger method not supported for non-export cases",
})


def _reason(exc, reason: str) -> str:
    """"<kind>: <explanation>" from Dynamo's graph break message."""
    lines = [line.strip() for line in (getattr(exc, "msg", None) or reason).splitlines()
             if line.strip()]
    if not lines:
        return "graph break"
    kind = lines[0]
    explanation = next((line[len("Explanation:"):].strip() for line in lines
                        if line.startswith("Explanation:")), "")
    return f"{kind}: {explanation}" if explanation else kind


def _user_line(exc) -> str:
    stack = getattr(exc, "real_stack", None)
    if not stack:
        return "unknown source line"
    frame = stack[-1]
    code = (frame.line or "").strip()
    return f"{frame.filename}:{frame.lineno}: {code}" if code else \
        f"{frame.filename}:{frame.lineno}"


def on_graph_break(reason: str, exc) -> None:
    """A graph break in a frame compiled for torchtpu: raise (strict) or count and warn."""
    what, where = _reason(exc, reason), _user_line(exc)
    if config.strict and getattr(exc, "gb_type", None) not in _AUTOGRAD_BREAKS:
        raise GraphBreakError(
            f"TORCHTPU_STRICT=1: torch.compile breaks the graph at {where} ({what}), and the "
            f"code there would run in eager PyTorch outside XLA (on the host for CPU "
            f"tensors). Make it traceable, or unset TORCHTPU_STRICT to allow graph breaks "
            f"(counted in torchtpu_compile.stats()['graph_breaks'])") from exc
    counters.count_graph_break(what)
    report = info_once if getattr(exc, "gb_type", None) in _LOGGING_BREAKS else warn_once
    report(("graph_break", what, where),
           "torchtpu: torch.compile breaks the graph at %s (%s); the code at the break runs "
           "in eager PyTorch, not XLA", where, what)


_backends: list = []  # the compiler functions whose graph breaks are ours to report


def _is_ours(compiler_fn) -> bool:
    for _ in range(8):  # Dynamo's wrappers: WrapBackendDebug -> _TorchCompileWrapper -> ours
        if compiler_fn is None:
            return False
        if any(compiler_fn is ours for ours in _backends):
            return True
        compiler_fn = getattr(compiler_fn, "_torchdynamo_orig_backend", None) or \
            getattr(compiler_fn, "compiler_fn", None) or getattr(compiler_fn, "__wrapped__", None)
    return False


def install(backend) -> None:
    """Report the graph breaks of frames compiled with ``backend`` (a compiler function),
    wrapping Dynamo's graph break report once per process; the backend module calls it.

    Example::

        graph_breaks.install(torchtpu_backend)
    """
    if not any(backend is ours for ours in _backends):
        _backends.append(backend)
    from torch._dynamo import symbolic_convert
    translator = symbolic_convert.InstructionTranslatorBase
    original = getattr(translator, "log_graph_break", None)
    if original is None:  # another torch: say so rather than let breaks pass unseen
        warn_once(("graph_break", "no hook"),
                  "torchtpu: this torch has no InstructionTranslatorBase.log_graph_break: graph "
                  "breaks are neither counted nor, under TORCHTPU_STRICT=1, errors")
        return
    if getattr(original, "_torchtpu", False):
        return

    def log_graph_break(self, code_options, reason, exc):
        if not getattr(exc, "logged", False) and \
                _is_ours(getattr(getattr(self, "output", None), "compiler_fn", None)):
            on_graph_break(reason, exc)
        return original(self, code_options, reason, exc)

    log_graph_break._torchtpu = True
    translator.log_graph_break = log_graph_break
