"""FX graph -> StableHLO module (torch-mlir's FX importer), our rewrites, bytecode, fingerprint.

Example::

    gm = make_fx(lambda x: x.sin() * 2, tracing_mode="fake")(torch.randn(4))
    lowered = lower_graph(gm, platform="cpu", precision="medium")
    lowered.bytecode, lowered.fingerprint
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import torch

from .. import counters
from ..errors import LoweringError
from .jax_calls import jax_callees
from .splice import import_with_callees
from .stablehlo_passes import PassContext, run_passes


# The ops whose lowering the matmul precision changes (precision_config on TPU, operands rounded
# to bf16 off TPU at "medium"), and custom calls (a jax_op's Pallas kernel, lowered by JAX under
# the precision in force). A jax_op's own dots are in the module's text like any other.
_PRECISION_DEPENDENT = re.compile(r"\bstablehlo\.(?:dot_general|dot|convolution|custom_call)\b")


@dataclass
class LoweredModule:
    """A StableHLO program ready for PJRT: bytecode plus a location-free fingerprint."""
    bytecode: bytes
    fingerprint: str
    text: str  # the StableHLO without location info (what the fingerprint hashes)
    # Devices to compile for, one replica each, when collectives cross processes inside the
    # program (collective_graphs.py); empty: the usual one-device program.
    replicas: tuple = ()

    @property
    def precision_sensitive(self) -> bool:
        """Whether lowering the graph at another matmul precision could give another program:
        it holds dots, convolutions or custom calls. A program that does not is kept for every
        precision (the eager device's programs); one that does is rebuilt when it changes.

        Example::

            lower_graph(mm_graph, "cpu", "medium").precision_sensitive      # True
            lower_graph(sin_graph, "cpu", "medium").precision_sensitive     # False
        """
        return _PRECISION_DEPENDENT.search(self.text) is not None


_ERROR_LINE = re.compile(r"error:\s*(.*)")
_LOCATION = re.compile(r'loc\("([^"]+)":(\d+):\d+\)')


def summarize_mlir_error(message: str) -> str:
    """The first diagnostic of a torch-mlir/MLIR failure, not the whole IR dump.

    The FX importer gives each op the location of the user's source line; it is kept.
    """
    for line in message.splitlines():
        m = _ERROR_LINE.search(line)
        if m:
            where = _LOCATION.search(line[:m.start()])
            text = m.group(1).strip()
            return f"{text} (at {where.group(1)}:{where.group(2)})" if where else text
    stripped = [l for l in message.strip().splitlines() if l.strip()]
    return stripped[0].strip()[:300] if stripped else "unknown error"


@contextlib.contextmanager
def _captured_stderr():
    # MLIR prints diagnostics straight to file descriptor 2; keep them out of the user's
    # terminal and hand them back for the error message.
    captured = {"text": ""}
    fd = 2  # MLIR writes to the process's stderr, whatever sys.stderr is now
    try:
        sys.stderr.flush()
    except (AttributeError, ValueError):
        pass
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            yield captured
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            captured["text"] = tmp.read().decode(errors="replace")


class _ImportContexts(threading.local):
    """One MLIR context per thread, shared by that thread's imports and replaced after
    ``_IMPORTS_PER_CONTEXT`` of them.

    torch-mlir's ``stateless_fx_import`` makes and tears down a context per graph, about
    10 ms of the 15-20 ms an import of one op takes: the eager device imports every op once per
    shape, so a first ``generate()`` paid it hundreds of times. A context keeps every type and
    attribute it has uniqued (constants among them) until it dies, hence the replacement;
    contexts are not shared across threads (background bucket compiles import too).
    """

    def __init__(self):
        self.context = None
        self.imports = 0

    def get(self, gm: torch.fx.GraphModule):
        """The context to import ``gm`` in: a fresh one of its own where it holds more than
        ``_SHARED_CONSTANT_BYTES`` of constants, which must die with its module."""
        if _constant_bytes(gm) > _SHARED_CONSTANT_BYTES:
            return _new_context()
        if self.context is None or self.imports >= _IMPORTS_PER_CONTEXT:
            self.context = _new_context()
            self.imports = 0
        self.imports += 1
        return self.context


def _new_context():
    from torch_mlir import ir
    from torch_mlir.dialects import torch as torch_dialect
    context = ir.Context()
    torch_dialect.register_dialect(context)
    return context


def _constant_bytes(gm: torch.fx.GraphModule) -> int:
    total = 0
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target, None)
            if isinstance(value, torch.Tensor):
                total += value.nbytes
    return total


# At most 256 imports x 64 KiB of constants kept alive per thread between replacements.
_IMPORTS_PER_CONTEXT = 256
_SHARED_CONSTANT_BYTES = 64 * 1024
_contexts = _ImportContexts()


def _fx_to_stablehlo(gm: torch.fx.GraphModule):
    # stateless_fx_import's two steps, on this thread's context (it makes one of its own even
    # when handed an importer).
    from torch_mlir import fx as torch_mlir_fx
    from torch_mlir.extras.fx_importer import FxImporter

    importer = FxImporter(context=_contexts.get(gm))
    importer.import_stateless_graph(gm.graph, func_name="main")
    return torch_mlir_fx._module_lowering(False, False, torch_mlir_fx.OutputType.STABLEHLO,
                                          importer.module)


def import_stablehlo(gm: torch.fx.GraphModule):
    """Run torch-mlir's FX importer and its StableHLO pipeline; raise LoweringError on failure."""
    with _captured_stderr() as err:
        try:
            module = _fx_to_stablehlo(gm)
        except Exception as exc:  # torch-mlir raises several types; all mean "did not lower"
            failure = exc
        else:
            failure = None
    if failure is not None:
        text = str(failure) + "\n" + err["text"]
        # torch-mlir's own asserts have no message (a sparse gradient's backward)
        detail = summarize_mlir_error(text) if text.strip() else \
            f"torch-mlir's importer raised {type(failure).__name__} with no message"
        raise LoweringError(detail) from failure
    return module


def lower_graph(gm: torch.fx.GraphModule, platform: str, precision: str,
                collectives=None) -> LoweredModule:
    """Lower a functional, static-shape ATen graph whose inputs are all tensors.

    ``collectives``: the graph's plan (``collective_graphs.plan_collectives``, made once by the
    program builder) when its functional collectives go into the program; None for a graph
    without them.
    """
    from .collective_graphs import collective_callees, without_waits
    start = time.perf_counter()
    passes = PassContext(platform=platform, precision=precision)
    plan = collectives
    try:
        if plan is not None:
            gm, plan = without_waits(gm, plan)
        callees = jax_callees(gm, platform, precision)
        if plan is not None:
            callees.update(collective_callees(plan))
        if callees:
            def import_aten(segment):
                module = import_stablehlo(segment)
                run_passes(module, passes)
                return module
            module = import_with_callees(gm, callees, import_aten)
        else:
            module = import_stablehlo(gm)
            run_passes(module, passes)
        text = module.operation.get_asm(enable_debug_info=False)
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
    finally:
        counters.add("lowering_seconds", time.perf_counter() - start)
    fingerprint = hashlib.sha256(text.encode()).hexdigest()
    return LoweredModule(bytecode=buf.getvalue(), fingerprint=fingerprint, text=text,
                         replicas=plan.devices if plan is not None else ())
