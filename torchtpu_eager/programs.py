"""Functional ATen graphs the eager device runs, each built once by the one program builder.

An ``OpGraph`` is what one op (or one view read or write, or a fused group of ops) becomes:
a functional FX graph traced with fake tensors and the compile path's decompositions. Its
program comes from ``torchtpu_compile.program.build_program`` (through the lowering and
executable caches every path shares) and runs on PJRT buffers (``Program.run``). The graph is
kept so that defer-and-fuse mode can splice many of them into one program.

A program whose lowering the matmul precision cannot change is kept for every precision; one
that holds dots, convolutions or a ``jax_op``'s kernel (``LoweredModule.precision_sensitive``)
is built again when the precision changes.

Example::

    graph = trace(lambda a, b: (torch.add(a, b),), [torch.empty(3), torch.empty(3)], "add")
    [out] = graph.run([buffer_a, buffer_b])
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import threading

import torch
import torch.fx as fx
from torch._C._dynamo.eval_frame import set_eval_frame

from torchtpu_compile.lower.fx_passes import normalize
from torchtpu_compile.lower.index_checks import INDEX_CHECK, one_op_at_a_time
from torchtpu_compile.lower.precision import resolve_precision
from torchtpu_compile.program import build_program, lower_program
from torchtpu_compile.runtime.client import get_client

from . import trace_cache
from .stats import COUNTERS

_ids = itertools.count()


@functools.cache
def _platform() -> str:
    return get_client().platform


@functools.cache
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
        self._any_precision = None   # the program, once it is known to fit every precision
        self._by_precision: dict = {}
        self._lowers = False
        # Indexing with tensor data: its runs report where they were called (index_errors).
        self.checked = any(n.op == "call_function" and n.target is INDEX_CHECK
                           for n in gm.graph.nodes)

    def program(self):
        """The ``Program`` at the current matmul precision (built on first use: module doc).

        Raises ``LoweringError`` for a graph that cannot be lowered (the op then runs on the
        host: ``dispatch.py``).
        """
        program = self._any_precision
        if program is not None:  # most ops: no precision to resolve per run
            return program
        precision = resolve_precision(_platform())
        program = self._by_precision.get(precision)
        if program is None:
            with outside_dynamo():
                program = self._by_precision[precision] = build_program(
                    self.gm, precision=precision, name=self.label, platform=_platform(),
                    rebuild_views=False, allow_fallback=False)
            if program.executable is not None:
                COUNTERS.add("eager_programs_compiled")
            if not program.precision_sensitive:
                self._any_precision = program
        return program

    def check_lowers(self) -> None:
        """Raise ``LoweringError`` if this graph cannot be lowered (no XLA compile)."""
        if not self._lowers:
            with outside_dynamo():
                lower_program(self.gm, precision=resolve_precision(_platform()),
                              platform=_platform(), rebuild_views=False)
            self._lowers = True

    def run(self, buffers: list, locations=None) -> list:
        """Run on concrete PJRT buffers; one buffer per graph output.

        Its index checks are kept for the next synchronization point (``index_errors.defer``),
        with ``locations``: where the op was called (``caller_location()``), or per entry of
        a fused graph.
        """
        return self.program().run(buffers, locations)


def splice(graphs: list, refs: list, n_inputs: int, wanted: list, label: str,
           mark_entries: bool = False) -> OpGraph:
    """One OpGraph running ``graphs`` in order: a fused recording (``fuse.py``), or an op with
    the reads of its strided inputs folded in (``dispatch.py``).

    ``refs[e]``: for each placeholder of ``graphs[e]``, ``(entry, index)`` of an earlier
    graph's output or ``-1 - k`` for input ``k`` of the ``n_inputs``; ``wanted``: the
    ``(entry, index)`` outputs of the result. ``mark_entries``: each index check names its
    entry, so its error reports that entry's call site (``index_errors``).

    Example::

        # read = a transpose of input 0, then mm(input 1, the transposed value)
        graph = splice([read, mm], [(-1,), (-2, (0, 0))], 2, [(1, 0)], "mm+read")
    """
    graph = fx.Graph()
    root = fx.GraphModule({}, fx.Graph())
    inputs = [graph.placeholder(f"in{i}") for i in range(n_inputs)]
    produced: list = []
    for entry, (op, op_refs) in enumerate(zip(graphs, refs)):
        env = {}
        for placeholder, ref in zip(op.placeholders, op_refs):
            if isinstance(ref, tuple):
                env[placeholder] = produced[ref[0]][ref[1]]
            else:
                node = env[placeholder] = inputs[-1 - ref]
                if "val" not in node.meta:
                    node.meta.update(placeholder.meta)
        outs = None
        for node in op.gm.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                outs = [env[n] for n in node.args[0]]
            elif node.op == "get_attr":
                name = f"const_{entry}_{node.target}"
                setattr(root, name, getattr(op.gm, node.target))
                env[node] = graph.get_attr(name)
                env[node].meta.update(node.meta)
            else:
                env[node] = graph.node_copy(node, env.__getitem__)
                if mark_entries and node.target is INDEX_CHECK:
                    env[node].meta["torchtpu_entry"] = entry
        produced.append(outs)
    graph.output(tuple(produced[e][i] for e, i in wanted))
    return OpGraph(fx.GraphModule(root, graph), label)


@contextlib.contextmanager
def outside_dynamo():
    """No frame run inside is offered to Dynamo's frame evaluation.

    The device builds programs inside frames Dynamo evaluates: code it leaves to run eagerly on
    tpu tensors (nn.LSTM under torch.compile) meets new ops. Our own frames there are skipped
    (``compile_support.teach_dynamo``), but the frames they call were not: Dynamo compiled the
    lowering's and jax_op's helpers, with dozens of graph breaks per new op. As
    ``torch._dynamo.disable`` does, without importing Dynamo.

    Dynamo's tracing context is put aside too: Dynamo runs some code for real while it traces
    (an optimizer's ``_init_group`` under a compiled ``opt.step()``), and ``make_fx`` took the
    context's fake mode, whose shape env made the op's shapes symbolic: the op fell back to the
    host (strict) or raised "unhashable type: non-nested SymInt" (defer-and-fuse).
    """
    prior = set_eval_frame(None)
    try:
        with torch._guards.tracing(None):
            yield
    finally:
        set_eval_frame(prior)


def _tracing_lock():
    """Dynamo's compile lock, held while this thread traces an op: make_fx patches process
    globals (torch.fx's ``CURRENT_PATCHER``), and threads tracing at once failed with
    "CURRENT_PATCHER is None in finally block" (the op then ran on the host) or traced into
    each other. Dynamo's lock, not one of ours: a compile in another thread patches them too.
    Reentrant, so a compile that runs a tpu op keeps it."""
    from torch._dynamo.convert_frame import compile_lock
    return compile_lock


def trace(fn, examples: list, label: str, what=None) -> OpGraph:
    """Trace ``fn`` (tensors in, tuple of tensors out) into a functional, decomposed OpGraph.

    ``examples`` (``example``) give shapes and dtypes only (their values are not read).
    ``what``: plain data saying all that ``fn`` does besides its inputs (``("read",
    geometry)``), for the graph to be kept across processes (``trace_cache``); None: traced
    in every process.
    """
    if what is not None:
        return trace_cache.cached(what, examples, label, _platform(),
                                  lambda: (trace(fn, examples, label), None))[0]
    COUNTERS.add("eager_traces")
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # Called from __torch_dispatch__, where every dispatch key above Python is excluded for
    # this thread; tracing needs functionalization and autograd keys back. The fused CPU
    # attention kernels do not lower; the math formulation does (as in the backend).
    include, exclude = _top_level_keys()
    with _tracing_lock(), torch._C._ForceDispatchKeyGuard(include, exclude), \
            sdpa_kernel(SDPBackend.MATH), torch.no_grad(), one_op_at_a_time(), \
            _quiet_meta_failures(), outside_dynamo():
        gm = make_fx(torch.func.functionalize(fn, remove="mutations"),
                     decomposition_table=_decompositions(),
                     tracing_mode="fake")(*_fake_examples(examples))
    normalize(gm)
    return OpGraph(gm, label)


class _MetaFailureFilter(logging.Filter):
    """Notes, and drops, fake tensor's log of a failed meta kernel while this thread traces an
    op.

    A meta kernel fails for inputs eager rejects (shapes that do not multiply, the mean of
    integers); the op then raises eager's error, as on CUDA (``meta_kernel_failed``). Fake
    tensor logs the failure with its traceback first, at ERROR: twenty lines before every
    shape error a user makes.
    """

    tracing = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(self.tracing, "on", False):
            return True
        message = str(record.msg)
        if message.startswith("failed while attempting to run meta"):
            self.tracing.meta_failed = True
            return False
        # A TypeError is logged, with its traceback, before it reaches us: a jax_op refusing
        # a dtype (complex128 arithmetic, which then runs on the host as documented).
        return not message.startswith("fake tensor raised TypeError")


def meta_kernel_failed() -> bool:
    """Whether a meta kernel raised during this thread's last ``trace`` (a sign, not proof,
    that eager rejects the op's inputs: a decomposition can also call an op wrongly).

    Example::

        try:
            trace(lambda a, b: (a @ b,), [example((2, 3), f32), example((4, 5), f32)], "mm")
        except RuntimeError:
            meta_kernel_failed()   # True: mm's meta kernel refused the shapes
    """
    return getattr(_meta_failure_filter().tracing, "meta_failed", False)


@functools.cache
def _meta_failure_filter() -> _MetaFailureFilter:
    quiet = _MetaFailureFilter()
    logging.getLogger("torch._subclasses.fake_tensor").addFilter(quiet)
    return quiet


@contextlib.contextmanager
def _quiet_meta_failures():
    tracing = _meta_failure_filter().tracing
    before, tracing.on, tracing.meta_failed = getattr(tracing, "on", False), True, False
    try:
        yield
    finally:
        tracing.on = before


@functools.cache
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
    """A meta tensor standing for a device value while tracing (``trace`` makes it a fake CPU
    tensor). It holds no memory: a host tensor of the value's size made the first op on a
    value larger than host memory raise the CPU allocator's error, not the device's."""
    return torch.empty(shape, dtype=dtype, device="meta")


def _fake_examples(examples: list) -> list:
    """``examples`` as fake CPU tensors of one fake mode, as ``make_fx(tracing_mode="fake")``
    would make from CPU tensors (meta ones are made CPU's without allocating)."""
    import torch._functorch.config as functorch_config
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with functorch_config.patch(fake_tensor_allow_unsafe_data_ptr_access=False):
        mode = FakeTensorMode(allow_fallback_kernels=True, shape_env=ShapeEnv(),
                              static_shapes=True)
    cpu = torch.device("cpu")
    convert = mode.fake_tensor_converter.from_meta_and_device
    return [convert(mode, e, cpu) if e.device.type == "meta" else mode.from_tensor(e)
            for e in examples]
