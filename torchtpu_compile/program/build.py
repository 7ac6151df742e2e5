"""The one program builder: a functional ATen graph to a runnable program, for every front end.

``build_program`` takes a graph with static shapes and tensor inputs and gives a ``Program``
(one XLA executable, ``run.py``) or, where some ops cannot go through XLA and the caller allows
it, a ``PartitionedProgram`` (those ops run in eager PyTorch between XLA regions); a backward
whose saved inputs die early may also run in pieces (``memory_split.py``). The steps are the
same for every caller:

1. normalize the graph (``lower/fx_passes.py``, in place);
2. plan its functional collectives, once (``lower/collective_graphs.py``): into the program,
   or cut the graph at them;
3. one support analysis (``lower/support.analyze``): every node that cannot be lowered, and
   why; where the whole graph then fails to lower, each op is probed alone;
4. the program calling convention (``lower/calling_convention.prepare``);
5. the lowering, through the one lowering cache (``lower/cache.lower_graph_cached``);
6. the compile, through the one executable cache (``run.compile_program``).

The callers: the compile path (``runner.GraphRunner``, per precision and shape; ``buckets/``
per bucket), the eager device (``torchtpu_eager/programs.py``: single-op and fused graphs,
``rebuild_views=False``, ``allow_fallback=False``: it runs a refused op on the host itself), AOT
export (``aot/export.py``) and numerics' op-by-op replay (``allow_fallback=False``). tpu_dist's
collective programs are StableHLO already: they enter at step 6.

Example::

    program = build_program(gm, precision="highest", name="forward")
    outputs = program([x, weight])
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .. import config, counters
from .._logging import log
from ..errors import LoweringError
from ..fallback_policy import fall_back
from ..host_semantics import eager_semantics, host_factories
from ..lower import lower_graph
from ..lower.cache import lower_graph_cached
from ..lower.calling_convention import is_random, prepare
from ..lower.collective_graphs import plan_collectives
from ..lower.fx_passes import normalize
from ..lower.support import (COLLECTIVE, ERROR_CHECK, analyze, describe, is_fallback,
                             op_name)
from ..profiling import BuildTrace, spanning, trace_artifact, tracing
from ..runtime.client import get_client
from .donation import DonatingProgram, donation_candidates
from .memory_split import enabled as splits_for_memory
from .memory_split import plan_pieces
from .run import Program, compile_program


def build_program(gm: fx.GraphModule, *, precision: str, name: str,
                  platform: str | None = None, resident_inputs: frozenset = frozenset(),
                  rebuild_views: bool = True, allow_fallback: bool = True,
                  skip_empty: bool = True, compile=compile_program,
                  mutated_inputs: tuple = (), eager_layouts: tuple = (),
                  inputs_die: bool = False):
    """A runnable program for ``gm`` (static shapes, tensor inputs) at ``precision``.

    ``name`` names it in errors, logs and stats; ``resident_inputs``: positions of parameters
    and buffers, uploaded once and reused; ``rebuild_views``: outputs that alias inputs or
    other outputs come back as views (callers that hold tensors; not the eager device's,
    whose programs return buffers). With ``allow_fallback`` a graph holding ops that cannot go
    through XLA becomes a ``PartitionedProgram`` (the fallback policy applied to each op:
    ``fallback_policy.py``); without, it raises ``LoweringError`` naming the first such op.
    ``skip_empty``: a graph with nothing to compute (every output an input, a constant or
    None) gets no executable; AOT artifacts, which hold one per program, compile it anyway.
    ``compile``: the compile half (``run.compile_program``'s signature); buckets built ahead
    pass one that compiles on their background thread. ``mutated_inputs``: (graph input,
    graph output) pairs, each output the input's new value (aot_autograd's input mutations):
    with ``config.donate_buffers``, the program reuses such an input's buffer for its output
    where nothing else holds it (``donation.py``). ``eager_layouts``: positions of the outputs
    the user sees, returned with eager's strides (``calling_convention.prepare``).
    ``inputs_die``: the caller hands its argument list over and keeps no input (a backward's
    saved activations): where cutting the graph lets large inputs and intermediates die
    sooner (``memory_split.py``) and ``config.split_backward`` allows it, it becomes a
    ``PartitionedProgram`` of pieces that empties the list.

    Example::

        program = build_program(gm, precision="medium", name="graph_0/forward",
                                resident_inputs=frozenset({1}))
        outputs = program([x, weight])
    """
    trace = BuildTrace(name, precision) if tracing() else None  # TORCH_TRACE (profiling.py)
    with spanning("torchtpu::build " + name), host_factories():
        program = _build(gm, precision, name, platform, resident_inputs, rebuild_views,
                         allow_fallback, skip_empty, compile, mutated_inputs, eager_layouts,
                         inputs_die)
    if trace is not None:
        trace.finish(program)
    return program


def _build(gm, precision, name, platform, resident_inputs, rebuild_views, allow_fallback,
           skip_empty, compile_half, mutated_inputs=(), eager_layouts=(), inputs_die=False):
    platform = platform or get_client().platform
    normalized = False
    if inputs_die and allow_fallback and not mutated_inputs and splits_for_memory(platform):
        normalize(gm)  # planned on what will be lowered (a loss's one-hot sum is gone)
        normalized = True
        pieces = plan_pieces(gm)
        if pieces is not None:
            counters.add("graphs_cut_for_memory")
            log.info("torchtpu: %s runs as %d programs, so that its inputs die between them",
                     name, max(pieces) + 1)
            return PartitionedProgram(gm, name, pieces=pieces, consume=True)
    prepared, lowered, reasons = _lower_half(gm, precision, platform, rebuild_views,
                                             allow_fallback, skip_empty, eager_layouts,
                                             normalized)
    if reasons:
        if not allow_fallback:
            raise _refusal(reasons)
        return _partitioned(gm, reasons, name, inputs_die)
    outputs = prepared.gm.graph.output_node().args[0]
    convention = dict(arg_indices=prepared.arg_indices, slots=prepared.outputs,
                      constants=prepared.constants, random_inputs=prepared.random_inputs,
                      resident_inputs=resident_inputs, prepared=prepared,
                      # Results go back to the device the graph computes on: host tensors for
                      # CPU inputs, tpu tensors (no round trip) for the eager tpu device's.
                      result_devices=[_device_type(node) for node in outputs])
    if lowered is None:  # nothing to compute: outputs are inputs, None or constants
        return Program(None, name=name, **convention)
    if mutated_inputs and config.donate_buffers and compile_half is compile_program:
        candidates = donation_candidates(prepared, mutated_inputs)
        if candidates:
            def compile_donating(donate):
                return compile_half(lowered, precision=precision, name=name, donate=donate,
                                    **convention)
            try:
                every = compile_donating({p: r for p, r, _ in candidates.values()})
            except LoweringError as exc:  # XLA refused the aliasing: run without it
                log.info("torchtpu: %s donates no buffer: %s", name, exc)
            else:
                return DonatingProgram(every, candidates, compile_donating)
    return compile_half(lowered, precision=precision, name=name, **convention)


def lower_program(gm: fx.GraphModule, *, precision: str, platform: str | None = None,
                  rebuild_views: bool = True):
    """The builder's lower half alone: ``gm``'s ``LoweredModule`` (None: nothing to compute),
    or ``LoweringError`` if it cannot be lowered whole (the eager device's defer-and-fuse
    mode checks each op so, and compiles only the fused graph).

    Example::

        lower_program(gm, precision="highest")      # raises LoweringError for aten.nonzero
    """
    platform = platform or get_client().platform
    _, lowered, reasons = _lower_half(gm, precision, platform, rebuild_views,
                                      allow_fallback=False)
    if reasons:
        raise _refusal(reasons)
    return lowered


def _lower_half(gm, precision: str, platform: str, rebuild_views: bool, allow_fallback: bool,
                skip_empty: bool = True, eager_layouts: tuple = (), normalized: bool = False):
    """(prepared graph, its lowered module or None, {}), or (None, None, {node: reason}): the
    nodes to cut the graph at (``allow_fallback``), else the first reason to refuse it."""
    if not normalized:
        normalize(gm)
    plan = plan_collectives(gm)
    reasons = analyze(gm, collectives_lowered=plan is not None)
    if not allow_fallback:
        # A caller that cannot cut the graph has no host to run by-design host work on (an
        # exported graph's _assert_tensor_metadata): the importer takes it or refuses it.
        reasons = {node: reason for node, reason in reasons.items() if is_fallback(reason)}
    if reasons:
        return None, None, reasons
    prepared = prepare(gm, rebuild_views=rebuild_views, platform=platform,
                       eager_layouts=eager_layouts)
    if prepared.num_program_outputs == 0 and skip_empty:
        return prepared, None, {}
    try:
        return prepared, lower_graph_cached(prepared.gm, platform=platform, precision=precision,
                                            collectives=plan), {}
    except LoweringError as whole_graph_error:
        if not allow_fallback:  # refused with the importer's own error
            raise

        def lower_one(one):
            return lower_graph(prepare(one, platform=platform).gm, platform=platform,
                               precision=precision)

        reasons = analyze(gm, collectives_lowered=plan is not None, lower_one=lower_one)
        if not reasons:
            raise LoweringError(
                f"the graph failed to lower although each of its ops lowers alone: "
                f"{whole_graph_error}") from whole_graph_error
        return None, None, reasons


def _refusal(reasons: dict) -> LoweringError:
    node, reason = next(iter(reasons.items()))
    return LoweringError(f"{op_name(node)}: {reason}")


def _device_type(node: fx.Node) -> str:
    value = node.meta.get("val")
    return value.device.type if isinstance(value, torch.Tensor) else "cpu"


def _partitioned(gm: fx.GraphModule, reasons: dict, name: str,
                 inputs_die: bool = False) -> PartitionedProgram:
    """The graph cut around ``reasons``' nodes, the fallback policy applied to each op."""
    collectives = sum(1 for reason in reasons.values() if reason == COLLECTIVE)
    if collectives:
        counters.COLLECTIVES.add("compiled_graph_collectives", collectives)
        log.info("torchtpu: graph %s is cut at %d collective op(s), which run through the "
                 "process group", name, collectives)
    fallbacks = {node: reason for node, reason in reasons.items() if is_fallback(reason)}
    for node, reason in fallbacks.items():
        fall_back(op_name(node), describe(node), reason, path="compile")
    if fallbacks:
        trace_artifact("torchtpu_fallbacks", lambda: {"graph": name, "ops": [
            {"op": op_name(node), "node": describe(node), "reason": reason}
            for node, reason in fallbacks.items()]})
    if any(reason == ERROR_CHECK for reason in reasons.values()):
        log.info("torchtpu: graph %s checks linalg errors on the host (as eager: a wait for the "
                 "device); the *_ex ops return the info instead", name)
    if fallbacks:
        counters.add("graphs_with_fallback")
    return PartitionedProgram(gm, name, bad=reasons, consume=inputs_die)


class _RegionModule(torch.nn.Module):
    """A lowered region inside a partitioned graph, called like the submodule it replaces."""

    def __init__(self, runner, single_output: bool, input_dtypes: list):
        super().__init__()
        self.runner = runner
        self.single_output = single_output
        # The dtype each input was traced with (None: not a tensor). An op that falls back to
        # eager PyTorch can return another dtype than its fake kernel said (bf16 batch norm's
        # statistics: bf16 on the CPU, f32 in the trace), and the lowered region is typed by
        # the trace: such an input is converted, as the traced graph assumed it was.
        self.input_dtypes = input_dtypes

    def forward(self, *args):
        args = [a.to(want) if want is not None and isinstance(a, torch.Tensor)
                and a.dtype != want else a for a, want in zip(args, self.input_dtypes)]
        outputs = self.runner(args)
        return outputs[0] if self.single_output else tuple(outputs)


class PartitionedProgram:
    """A graph run as a sequence of regions: lowered ones, each a ``GraphRunner`` of its own
    (built through ``build_program``), with eager PyTorch between them where some nodes
    cannot go through XLA (``bad``: {node: reason}), or cut into pieces that all lower
    (``pieces``: a piece index per compute node, ``memory_split.plan_pieces``) so that inputs
    die between them. A region fed by a fallback op of data-dependent shape (masked_select)
    has symbolic input sizes, and its runner specializes at call time.

    ``consume``: the caller hands its argument list over (a backward's saved activations,
    ``GraphRunner``): it is emptied, and each input dies after the last region that reads it,
    as in Inductor's code, instead of living to the end of the call.

    Example::

        program = PartitionedProgram(gm, "graph_0/forward", bad={nonzero_node: "data-dependent"})
        outputs = program([x])
    """

    def __init__(self, gm: fx.GraphModule, name: str, *, bad: dict | None = None,
                 pieces: list | None = None, consume: bool = False):
        from torch.fx.graph import _BoxedCodeGen

        from .runner import GraphRunner  # a region is a graph of its own (module doc)

        fused = _by_support(gm, bad) if pieces is None else _by_piece(gm, pieces)
        for node in list(fused.graph.nodes):
            if node.op != "call_module":
                continue
            sub = getattr(fused, node.target)
            sub_placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
            for ph, arg in zip(sub_placeholders, node.args):
                ph.meta["val"] = arg.meta.get("val")
            output = sub.graph.output_node()
            single = not isinstance(output.args[0], (tuple, list))
            _pass_on_values(node, output.args[0], single)
            if single:  # a graph returns a tuple everywhere else (the runner reads it so)
                output.args = ((output.args[0],),)
                sub.recompile()
            runner = GraphRunner(sub, name=f"{name}/{node.target}")
            dtypes = [v.dtype if isinstance(v, torch.Tensor) else None
                      for v in (ph.meta.get("val") for ph in sub_placeholders)]
            setattr(fused, node.target, _RegionModule(runner, single, dtypes))
        # One list in, emptied once read; each value dropped after its last reader (FX's
        # code does that for every value but the arguments, which a caller's tuple would hold).
        fused.graph.set_codegen(_BoxedCodeGen())
        fused.recompile()
        self.gm = fused
        self.name = name
        self.consume = consume
        self.regions = sum(1 for node in fused.graph.nodes if node.op == "call_module")

    def __call__(self, args: list, device: str | None = None) -> list:
        """The outputs, on ``device`` where given (as ``Program``: a bucket's program runs on
        host tensors, its results go to the graph's device)."""
        with eager_semantics():
            out = self.gm(args if self.consume else list(args))
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        if device is None:
            return out
        return [o.to(device) if isinstance(o, torch.Tensor) else o for o in out]


def _pass_on_values(node: fx.Node, results, single: bool) -> None:
    """The traced values of a region's results on the nodes that read them in the outer
    graph, so that the next region's inputs have static sizes where the trace's had."""
    if single:
        node.meta["val"] = results.meta.get("val") if isinstance(results, fx.Node) else None
        return
    for user in node.users:
        if user.target is operator.getitem and isinstance(user.args[1], int):
            result = results[user.args[1]]
            user.meta["val"] = result.meta.get("val") if isinstance(result, fx.Node) else None


def _by_support(gm: fx.GraphModule, bad: dict) -> fx.GraphModule:
    """``gm`` with each largest region of lowerable nodes made a submodule."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    class Support(OperatorSupportBase):
        def is_node_supported(self, submodules, node):
            if node.op != "call_function" or node in bad:
                return False
            if node.target is operator.getitem:
                return node.args[0] not in bad
            return True

    support = Support()
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    if sum(1 for node in gm.graph.nodes if is_random(node)) > 1:
        return partitioner.fuse_partitions(_runs_in_graph_order(gm, support))
    return partitioner.fuse_partitions(partitioner.propose_partitions())


def _runs_in_graph_order(gm: fx.GraphModule, support) -> list:
    """Each run of lowerable nodes between two that are not, as one partition, in graph order.

    A region draws its random numbers from torch's generator when it starts, and an op that
    falls back draws when it runs. The capability partitioner merges independent nodes across
    a fallback and moves regions, so draws came in another order than eager's (``k =
    poisson(...); eps = randn(...)`` gave eager's values swapped). Runs keep every node where
    the graph has it: each region runs where its nodes were. A ``getitem`` moves right after
    the node it reads first, so that a region never hands a tuple to another.
    """
    from torch.fx.passes.infra.partitioner import Partition

    for node in list(gm.graph.nodes):
        if node.target is operator.getitem and isinstance(node.args[0], fx.Node):
            node.args[0].append(node)
    runs, run = [], []
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            continue  # read, not run: a region takes them as inputs
        if node.op == "call_function" and support.is_node_supported(None, node):
            run.append(node)
        elif run:
            runs.append(run)
            run = []
    if run:
        runs.append(run)
    return [Partition(id=i, nodes=nodes) for i, nodes in enumerate(runs)]


def _by_piece(gm: fx.GraphModule, pieces: list) -> fx.GraphModule:
    """``gm`` with the compute nodes of each piece (``pieces``: one index per compute node, in
    graph order, never decreasing) made a submodule, called in order."""
    from torch.fx.passes.split_module import split_module
    compute = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    piece_of = dict(zip(compute, pieces))
    return split_module(gm, gm, lambda node: piece_of[node], keep_original_order=True)
