"""What the compile path hands aot_autograd for each graph: a ``GraphRunner``.

Per precision mode and, for graphs with symbolic sizes, per bucket (``buckets/``) or concrete
shape, it builds a program through the one builder (``build.build_program``) and runs it.

Example::

    runner = GraphRunner(fx_graph_module, name="graph_0/forward")
    outputs = runner([x, weight])
"""
from __future__ import annotations

import itertools

import torch
import torch.autograd.forward_ad as forward_ad
import torch.fx as fx
from torch._C._dynamo.guards import compute_overlapping_tensors
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.proxy_tensor import make_fx

from .. import config, counters
from .._logging import log, warn_once
from ..fallback_policy import fall_back
from ..lower.calling_convention import pin_rng_state_sizes
from ..lower.precision import resolve_precision
from ..runtime import memory
from ..runtime.client import get_client
from .build import build_program
from .donation import host_adoptions

_graph_ids = itertools.count()


def _build_outside_fake(gm: fx.GraphModule, precision: str, name: str, resident_inputs,
                        **options):
    # Called at run time, but a region of a partitioned graph may be built while
    # aot_autograd's fake mode is active; constants and probes must be real.
    with unset_fake_temporarily():
        return build_program(gm, precision=precision, name=name,
                             resident_inputs=resident_inputs, **options)


def _is_static(gm: fx.GraphModule) -> bool:
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return False
        if any(not isinstance(s, int) for s in val.shape):
            return False
    return True


def _concrete_key(args) -> tuple:
    return tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


def specialize(gm: fx.GraphModule, args: list) -> fx.GraphModule:
    """Re-trace a graph with symbolic sizes or scalar inputs at the concrete ``args``."""
    from ..lower.decompositions import decomposition_table
    from ..lower.index_checks import unchecked
    concrete = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    # Ops the table leaves whole at a symbolic size (scans, searchsorted: they unroll over it)
    # are decomposed now that sizes are concrete, as buckets/trace.py does for a bucket;
    # lowered whole, they missed eager's semantics (bucketize's NaN, half-width scans).
    with torch.no_grad(), unchecked():
        traced = make_fx(fx.Interpreter(gm).run, decomposition_table=decomposition_table(),
                         tracing_mode="fake")(*concrete)
    for node, original in zip((n for n in traced.graph.nodes if n.op == "placeholder"), args):
        if not isinstance(original, torch.Tensor):
            node.meta["val"] = original
    return traced


def refuse_written_aliases(args: list, mutated_inputs: tuple, name: str) -> None:
    """Raise where an input the graph writes overlaps another input's memory in this call.

    Such a graph was compiled for separate inputs: aot_autograd compiles inputs that alias and
    are written through one "synthetic base", but Dynamo does not compile again when a later
    call passes aliasing inputs (Inductor reads real memory, where the write shows anyway). A
    program's inputs are values: its results missed the write (``w.add_(1); return x * 1``
    with ``w = x[:4]`` returned x before the write), with no error. Views are what alias
    (the same tensor twice is deduplicated above us), so calls without one cost a scan.

    Only the written inputs and the views are grouped by the tensor they view: two other inputs
    that are not views are distinct tensors. A written view's base may also be passed itself,
    so only then is every input's identity looked at (a decode step passes a view beside its
    weights each call: grouping every weight cost it ~180 C calls)."""
    views = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor) and a._base is not None]
    if not views:
        return
    groups: dict = {}
    written = {i for i, _ in mutated_inputs}
    written_bases = set()
    for k in written.union(views):
        a = args[k]
        base = a._base
        if base is not None and k in written:
            written_bases.add(id(base))
        groups.setdefault(id(base if base is not None else a), []).append(k)
    if written_bases:  # a written view's base, passed as an input too
        for k, a in enumerate(args):
            if id(a) in written_bases and k not in written:
                groups[id(a)].append(k)
    for members in groups.values():
        if len(members) > 1 and written.intersection(members):
            overlapping = {members[k] for k in compute_overlapping_tensors(
                [args[m] for m in members])}
            if written & overlapping and len(overlapping) > 1:
                shapes = [list(args[k].shape) for k in sorted(overlapping)]
                raise RuntimeError(
                    f"torchtpu: {name} writes an input that overlaps the memory of another "
                    f"in this call (inputs of shapes {shapes}, views of one tensor); the graph "
                    f"was compiled for inputs that do not overlap, and its results would miss "
                    f"the write. Pass separate tensors (clone one), or call "
                    f"torch._dynamo.reset() so that the function is compiled again for these "
                    f"inputs.")


def copy_module(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with a copy of its graph (nodes and their meta), sharing its parameters and
    constants: rewriting the copy's graph leaves ``gm``'s as it was.

    Example::

        copy = copy_module(gm); copy.graph.erase_node(...)   # gm unchanged
    """
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return fx.GraphModule(gm, graph)


def _has_tangents(args: list) -> bool:
    """Whether a forward-mode AD level is open and an argument carries a tangent at it.

    Example::

        with fwAD.dual_level():
            _has_tangents([fwAD.make_dual(x, t)])   # True
    """
    if forward_ad._current_level < 0:  # no dual level open: the common case, one read
        return False
    return any(isinstance(a, torch.Tensor) and forward_ad.unpack_dual(a).tangent is not None
               for a in args)


def _refuse_views_of_inputs(gm: fx.GraphModule, user_outputs: tuple,
                            mutated_inputs: tuple = ()) -> None:
    """Raise NotPaddable where a user output is a view of a graph input, or of the new value
    of an input the graph writes (``mutated_inputs``: (input, output) pairs), which
    aot_autograd rebuilds as a view of the input too (``x.add_(1); return x[n // 2:]`` lost
    its offset: fuzz seed 1345).

    aot_autograd rebuilds such an output from the input with the size and strides of the one
    the graph returns; a bucket returns contiguous copies cut back from its padded results, so
    ``x[..., ::2].expand(2, ...)`` came back reading the wrong elements (no error) or raised
    ``setStorage ... out of bounds``. Compiled per exact shape, the output keeps eager's
    strides.

    Example::

        _refuse_views_of_inputs(gm, (0,))   # NotPaddable: output 0 is a view of input arg0_1
    """
    from ..buckets import NotPaddable
    outputs = gm.graph.output_node().args[0]
    new_values = {outputs[j] for _, j in mutated_inputs if j < len(outputs)}
    for i in user_outputs:
        node = outputs[i] if i < len(outputs) else None
        while isinstance(node, fx.Node) and node.op == "call_function" and \
                isinstance(node.target, torch._ops.OpOverload) and node.target.is_view:
            node = node.args[0]
        if isinstance(node, fx.Node) and (node.op == "placeholder" or node in new_values) \
                and node is not outputs[i]:
            raise NotPaddable(f"output {i} is a view of input {node.name}, which aot_autograd "
                              f"rebuilds with the strides the graph returns")


class GraphRunner:
    """The callable aot_autograd gets for one graph (boxed: called with a list of args).

    Example::

        runner = GraphRunner(fx_graph_module, name="forward")
        outputs = runner([x, weight])
    """

    def __init__(self, gm: fx.GraphModule, name: str | None = None,
                 resident_inputs: frozenset = frozenset(), mutated_inputs: tuple = (),
                 eager_layouts: tuple = (), inputs_die: bool = False):
        # An instance attribute, so that wrappers which copy __dict__ (torch._dynamo.disable,
        # around backward graphs) still tell aot_autograd we take boxed arguments.
        self._boxed_call = True
        # Building rewrites the graph in place for XLA (lower/fx_passes.py: tpu literals made
        # host ones, C's fmod renamed aten.remainder), so it rewrites a copy: ``gm`` stays
        # aot_autograd's graph, the one the graph cache pickles and the one eager PyTorch
        # runs for calls with forward-mode AD tangents (_run_with_tangents).
        self._source = gm
        self.gm = copy_module(gm)
        self.name = name or f"graph_{next(_graph_ids)}"
        pin_rng_state_sizes(self.gm)
        self.static = _is_static(self.gm)
        self.resident_inputs = resident_inputs
        # (input, output) pairs: the output is the input's new value (donation.py); static
        # graphs only (a specialized graph's inputs are numbered otherwise)
        self.mutated_inputs = tuple(mutated_inputs) if self.static else ()
        # the same pairs numbered as the graph's inputs, which are a call's arguments: for the
        # alias check of every call, and a bucketed graph's write-back
        self._graph_mutated = tuple(mutated_inputs)
        # the outputs the user sees, returned with eager's strides (calling_convention.py);
        # a bucket's outputs are cut back into contiguous copies
        self.eager_layouts = tuple(eager_layouts)
        # aot_autograd lets go of a backward's inputs (the saved activations) when it calls
        # it boxed: a large graph may run in pieces that free them sooner (memory_split.py)
        self.inputs_die = inputs_die
        self._programs: dict = {}
        self._bucketed = None  # a BucketedGraph once called; False: compile per exact shape
        self._platform = get_client().platform
        if self.static:
            self._program_for(resolve_precision(self._platform), None)

    def _program_for(self, precision: str, args):
        key = (precision, None if self.static else _concrete_key(args))
        program = self._programs.get(key)
        if program is None:
            gm = self.gm if self.static else specialize(self.gm, args)
            label = self.name if self.static else f"{self.name}{list(key[1])}"
            log.debug("building %s at precision %s", label, precision)
            # aot_autograd calls compilers with its fake mode active; our constants, host
            # tensors and probes must be real.
            with unset_fake_temporarily():
                program = build_program(gm, precision=precision, name=label,
                                        resident_inputs=self.resident_inputs,
                                        mutated_inputs=self.mutated_inputs,
                                        eager_layouts=self.eager_layouts,
                                        inputs_die=self.inputs_die and self.static)
            base = getattr(program, "base", program)  # a DonatingProgram's first
            if self.mutated_inputs and hasattr(base, "adopt_inputs"):
                # a static KV cache: no copy of its new value back (donation.py)
                base.adopt_inputs(host_adoptions(base, self.mutated_inputs))
            # a bucketed graph comes here for a call its buckets cannot serve (SizesDiffer)
            counters.record_compile(self.name, exact_shape=self._bucketed is not None)
            self._programs[key] = program
        return program

    def _run_bucketed(self, args: list, precision: str):
        """Outputs from the graph's padded buckets, or None where it needs exact shapes."""
        from ..buckets import BucketedGraph, NotPaddable, SizesDiffer
        try:
            if self._bucketed is None:
                _refuse_views_of_inputs(self.gm, self.eager_layouts, self._graph_mutated)
                self._bucketed = BucketedGraph(self.gm, self.name, _build_outside_fake,
                                               self.resident_inputs, self._graph_mutated)
            return self._bucketed(args, precision)
        except NotPaddable as reason:
            self._bucketed = False
            warn_once(("exact_shape", self.name),
                      "torchtpu: %s compiles once per shape, not per bucket: %s", self.name,
                      reason)
            return None
        except SizesDiffer as reason:
            warn_once(("sizes_differ", self.name),
                      "torchtpu: %s runs a program of the exact shapes for calls where %s",
                      self.name, reason)
            return None

    def _run_with_tangents(self, args: list) -> list:
        """The graph run by eager PyTorch, whose ops carry dual tensors' tangents.

        An XLA program computes values only: the tangents of dual inputs
        (``torch.autograd.forward_ad``) were dropped and ``unpack_dual`` of the result gave
        None where eager gives the jvp. Under strict, an error; otherwise counted and warned
        about once, as any fallback.
        """
        fall_back("forward_ad", f"{self.name} called with forward-mode AD dual tensors",
                  "an XLA program computes no tangents", path="compile")
        if "forward" not in type(self._source).__dict__:
            # A graph the cache unpickled has no generated code until asked (the XLA program
            # never needs it): "missing the required 'forward' function" in a warm process.
            self._source.recompile()
        return list(self._source(*args))

    def __call__(self, *call_args) -> list:
        # aot_autograd calls forward graphs boxed (one list) and, through Dynamo's disable
        # wrapper, backward graphs with positional args; graph inputs are never lists.
        boxed = len(call_args) == 1 and type(call_args[0]) is list
        args = call_args[0] if boxed else list(call_args)
        if _has_tangents(args):
            return self._run_with_tangents(args)
        if self._graph_mutated:  # bucketed graphs too: their results missed the write
            refuse_written_aliases(args, self._graph_mutated, self.name)
        precision = resolve_precision(self._platform)
        outputs = None
        if not self.static and config.buckets and self._bucketed is not False:
            outputs = self._run_bucketed(args, precision)
        if outputs is None:
            program = self._programs.get((precision, None)) if self.static else None
            if program is None:
                program = self._program_for(precision, args)
            outputs = program(args)
        if boxed:
            args.clear()  # let inputs die as early as eager would
            memory.release_dropped()  # and free their memory now, not at Python's next gc
        return outputs
