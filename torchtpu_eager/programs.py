"""Functional ATen graphs the eager device runs, each compiled once through the one lowering.

An ``OpGraph`` is what one op (or one view read or write, or a fused group of ops) becomes:
a functional FX graph traced with fake tensors and the compile path's decompositions, lowered
by ``torchtpu_compile.lower`` and compiled behind its cache. The graph is kept so that
defer-and-fuse mode can splice many of them into one program.

Example::

    graph = trace(lambda a, b: (torch.add(a, b),), [torch.empty(3), torch.empty(3)], "add")
    [out] = graph.run([buffer_a, buffer_b])
"""
from __future__ import annotations

import functools
import itertools

import torch
import torch.fx as fx

from torchtpu_compile import counters, index_errors
from torchtpu_compile.lower import lower_graph
from torchtpu_compile.lower.calling_convention import prepare
from torchtpu_compile.lower.fx_passes import normalize
from torchtpu_compile.lower.index_checks import INDEX_CHECK, one_op_at_a_time
from torchtpu_compile.lower.precision import resolve_precision
from torchtpu_compile.output_slots import empty_tensor
from torchtpu_compile.runtime.client import get_client
from torchtpu_compile.runtime.executable import compile_stablehlo
from torchtpu_compile.runtime.transfer import to_buffer

_ids = itertools.count()
aten = torch.ops.aten

#: Ops whose lowering depends on the matmul precision mode.
_PRECISION_OPS = {
    aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default,
    aten.addbmm.default, aten.dot.default, aten.mv.default, aten.addmv.default,
    aten.convolution.default, aten._convolution.default, aten.matmul.default,
    aten.linear.default, aten.vdot.default, aten.tensordot.default,
}


@functools.lru_cache(maxsize=None)
def _platform() -> str:
    return get_client().platform


@functools.lru_cache(maxsize=None)
def _decompositions() -> dict:
    from torchtpu_compile.lower.decompositions import decomposition_table
    return decomposition_table()


class OpGraph:
    """A traced functional graph: tensors in, a flat tuple of tensors out."""

    def __init__(self, gm: fx.GraphModule, label: str):
        self.gm = gm
        self.label = label
        self.id = next(_ids)  # small and unique: the fused-graph signature is built from ids
        out = gm.graph.output_node().args[0]
        self.out_meta = [(tuple(n.meta["val"].shape), n.meta["val"].dtype) for n in out]
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self._compiled: dict = {}
        # Only dots and convolutions depend on the matmul precision: other programs skip
        # resolving it on every run.
        self._precision_free = not any(n.op == "call_function" and n.target in _PRECISION_OPS
                                       for n in gm.graph.nodes)
        # Indexing with tensor data: its runs report where they were called (index_errors).
        self.checked = any(n.op == "call_function" and n.target is INDEX_CHECK
                           for n in gm.graph.nodes)

    def _build(self, precision: str):
        prepared = prepare(self.gm, rebuild_views=False)
        executable = None
        if prepared.num_program_outputs:
            client = get_client()
            lowered = lower_graph(prepared.gm, platform=client.platform, precision=precision)
            executable = compile_stablehlo(lowered.bytecode, lowered.fingerprint, precision,
                                           what=self.label)
            counters.add("eager_programs_compiled")
        return prepared, executable

    def check_lowers(self) -> None:
        """Raise ``LoweringError`` if this graph cannot be lowered (no XLA compile)."""
        if getattr(self, "_lowers", False):
            return
        prepared = prepare(self.gm, rebuild_views=False)
        if prepared.num_program_outputs:
            client = get_client()
            lower_graph(prepared.gm, platform=client.platform,
                        precision=resolve_precision(client.platform))
        self._lowers = True

    def compiled(self):
        """(prepared graph, executable) at the current matmul precision."""
        if self._precision_free:
            entry = self._compiled.get(None)
            if entry is None:
                entry = self._compiled[None] = self._build(resolve_precision(_platform()))
            return entry
        precision = resolve_precision(_platform())
        entry = self._compiled.get(precision)
        if entry is None:
            entry = self._compiled[precision] = self._build(precision)
        return entry

    def run(self, buffers: list, locations=None) -> list:
        """Run on concrete PJRT buffers; one buffer per graph output.

        Its index checks are kept for the next synchronization point (``index_errors.defer``),
        with ``locations``: where the op was called (``caller_location()``), or per entry of
        a fused graph.
        """
        prepared, executable = self.compiled()
        results = ()
        if executable is not None:
            inputs = [buffers[i] for i in prepared.arg_indices]
            if prepared.constants:  # resident by the one rule of runtime.transfer.to_buffer
                inputs += [to_buffer(c, True) for c in prepared.constants]
            if prepared.random_inputs:
                inputs += [to_buffer(draw()) for draw in prepared.random_inputs]
            results = executable.run(inputs)
        outputs = []
        for slot in prepared.outputs:
            kind = slot.kind
            if kind == "program":
                outputs.append(results[slot.index])
            elif kind == "input":
                outputs.append(buffers[slot.index])
            elif kind == "empty":
                outputs.append(to_buffer(empty_tensor(slot.value, "cpu")))
            elif kind == "check":
                index_errors.defer(results[slot.index], slot.value, locations)
            else:
                raise RuntimeError(f"{self.label}: graph output of kind {kind!r} is not a tensor")
        return outputs


def trace(fn, examples: list, label: str) -> OpGraph:
    """Trace ``fn`` (tensors in, tuple of tensors out) into a functional, decomposed OpGraph.

    ``examples`` are CPU tensors giving shapes and dtypes only (their values are not read).
    """
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # Called from __torch_dispatch__, where every dispatch key above Python is excluded for
    # this thread; tracing needs functionalization and autograd keys back. The fused CPU
    # attention kernels do not lower; the math formulation does (as in the backend).
    include, exclude = _top_level_keys()
    with torch._C._ForceDispatchKeyGuard(include, exclude), sdpa_kernel(SDPBackend.MATH), \
            torch.no_grad(), one_op_at_a_time():
        gm = make_fx(torch.func.functionalize(fn, remove="mutations"),
                     decomposition_table=_decompositions(), tracing_mode="fake")(*examples)
    normalize(gm)
    return OpGraph(gm, label)


@functools.lru_cache(maxsize=None)
def _top_level_keys():
    """The thread-local dispatch key sets outside any dispatch: autocast off, nothing else."""
    keys = torch._C.DispatchKey
    exclude = torch._C.DispatchKeySet(keys.AutocastCPU)
    for name in dir(keys):
        if name.startswith("Autocast"):
            exclude = exclude.add(getattr(keys, name))
    include = torch._C.DispatchKeySet(keys.BackendSelect).add(keys.ADInplaceOrView)
    return include, exclude


def example(shape, dtype) -> torch.Tensor:
    """A CPU tensor standing for a device value while tracing (never read)."""
    return torch.empty(shape, dtype=dtype)
