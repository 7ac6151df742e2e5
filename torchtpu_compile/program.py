"""From an aot_autograd graph to something that runs: compiled programs and eager fallback.

``GraphRunner`` is what the backend hands back to aot_autograd for each forward, backward or
inference graph. Per precision mode and (for graphs with symbolic sizes) per concrete shape, it
builds one of:

- ``Program``: the whole graph as one XLA executable;
- ``PartitionedProgram``: the graph cut around ops that cannot be lowered; lowerable regions run
  as ``Program``s, the rest runs in eager PyTorch, counted in stats and warned about once per op.
"""
from __future__ import annotations

import itertools
import operator

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.proxy_tensor import make_fx

from . import config, counters
from ._logging import log, warn_once
from .errors import LoweringError, UnsupportedOpError
from .lower import lower_graph
from .lower.cache import lower_graph_cached
from .lower.collective_graphs import plan_collectives
from .lower.calling_convention import pin_rng_state_sizes, prepare
from .lower.fx_passes import normalize
from .lower.precision import resolve_precision
from .lower.support import describe, is_host_scalar, op_name, probe, rule_violation
from .output_slots import check_index, collect_outputs
from .runtime.client import get_client
from .runtime.executable import compile_stablehlo
from .runtime.transfer import to_buffer, wrapper_for

_graph_ids = itertools.count()
_Parameter = torch.nn.Parameter

#: The "reason" of nodes that compute host scalars (sizes, asserts) rather than tensors.
HOST_SCALAR = "host scalar arithmetic"
#: The "reason" of functional collectives: the graph is cut there and the collective runs
#: through its process group (tpu_dist), by design rather than as a fallback.
COLLECTIVE = "collective through the process group"
_COLLECTIVE_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")
#: The "reason" of linalg's error checks (torch.linalg.cholesky raising for a matrix that is
#: not positive definite): they read the op's info on the host and raise, as eager does.
ERROR_CHECK = "error check on the host"
_ERROR_CHECKS = (torch.ops.aten._linalg_check_errors.default,)


def _is_error_check(node: fx.Node) -> bool:
    return (node.op == "call_function" and node.target is torch.ops.higher_order.with_effects
            and len(node.args) > 1 and node.args[1] in _ERROR_CHECKS)


def _is_collective(node: fx.Node) -> bool:
    return node.op == "call_function" and \
        getattr(node.target, "namespace", None) in _COLLECTIVE_NAMESPACES


class Program:
    """One XLA executable plus the calling convention around it."""

    def __init__(self, gm: fx.GraphModule, precision: str, name: str, prepared=None,
                 lowered=None, resident_inputs: frozenset = frozenset()):
        self.client = get_client()
        platform = self.client.platform
        self.prepared = prepared or prepare(gm)
        self.name = name
        self.resident_inputs = resident_inputs
        self._defer_checks = False
        if self.prepared.num_program_outputs == 0:
            self.executable = None  # nothing to compute: outputs are inputs, None or constants
            return
        if lowered is None:
            lowered = lower_graph_cached(self.prepared.gm, platform=platform,
                                         precision=precision)
        self.lowered = lowered
        self.executable = compile_stablehlo(lowered.bytecode, lowered.fingerprint, precision,
                                            what=name, replicas=lowered.replicas)
        # Results go back to the device the graph computes on: host tensors for CPU inputs,
        # tpu tensors (no round trip through the host) for tensors of the eager tpu device.
        outputs = self.prepared.gm.graph.output_node().args[0]
        self._wrap = [wrapper_for(_device_type(node)) for node in outputs]
        check = check_index(self.prepared.outputs)
        # Index checks of results left on the device are read at its next synchronization.
        if check is not None:
            self._wrap[check] = _unwrapped
            self._defer_checks = any(_device_type(node) != "cpu" for node in outputs
                                     if node is not outputs[check])

    def __call__(self, args: list) -> list:
        prepared = self.prepared
        results = []
        if self.executable is not None:
            client = self.client
            resident = self.resident_inputs
            # type() is, not isinstance(): Parameter's metaclass makes isinstance ~1 us an arg.
            buffers = [to_buffer(args[i], i in resident or type(args[i]) is _Parameter, client)
                       for i in prepared.arg_indices]
            buffers += [to_buffer(c, True, client) for c in prepared.constants]
            buffers += [to_buffer(draw(args), False, client) for draw in prepared.random_inputs]
            results = [wrap(b) for wrap, b in zip(self._wrap, self.executable.run(buffers))]
        return collect_outputs(prepared.outputs, results, args, defer_checks=self._defer_checks)


def _unwrapped(buffer):
    return buffer


def _device_type(node: fx.Node) -> str:
    value = node.meta.get("val")
    return value.device.type if isinstance(value, torch.Tensor) else "cpu"


class _RegionModule(torch.nn.Module):
    """A lowered region inside a partitioned graph, called like the submodule it replaces."""

    def __init__(self, runner: "GraphRunner", single_output: bool, input_dtypes: list):
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
    """A graph whose unsupported nodes run in eager PyTorch and the rest through XLA."""

    def __init__(self, gm: fx.GraphModule, bad: dict, name: str):
        from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
        from torch.fx.passes.operator_support import OperatorSupportBase

        class Support(OperatorSupportBase):
            def is_node_supported(self, submodules, node):
                if node.op != "call_function" or node in bad:
                    return False
                if node.target is operator.getitem:
                    return node.args[0] not in bad
                return True

        partitioner = CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=True)
        fused = partitioner.fuse_partitions(partitioner.propose_partitions())
        for node in list(fused.graph.nodes):
            if node.op != "call_module":
                continue
            sub = getattr(fused, node.target)
            sub_placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
            for ph, arg in zip(sub_placeholders, node.args):
                ph.meta["val"] = arg.meta.get("val")
            out_arg = sub.graph.output_node().args[0]
            single = not isinstance(out_arg, (tuple, list))
            # A region fed by a fallback op of data-dependent shape (masked_select) has
            # symbolic input sizes: its runner specializes at call time.
            runner = GraphRunner(sub, name=f"{name}/{node.target}")
            dtypes = [v.dtype if isinstance(v, torch.Tensor) else None
                      for v in (ph.meta.get("val") for ph in sub_placeholders)]
            setattr(fused, node.target, _RegionModule(runner, single, dtypes))
        fused.recompile()
        self.gm = fused
        self.name = name

    def __call__(self, args: list) -> list:
        out = self.gm(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]


def _find_unsupported(gm: fx.GraphModule, platform: str, precision: str):
    """(bad nodes with reasons, lowered module of the whole graph if it lowered)."""
    bad = {}
    # Collectives lower into the program when their group allows it, else the graph is cut.
    cut_collectives = plan_collectives(gm) is None
    for node in gm.graph.nodes:
        if _is_collective(node) and cut_collectives:
            bad[node] = COLLECTIVE
            continue
        if is_host_scalar(node):
            bad[node] = HOST_SCALAR
            continue
        if _is_error_check(node):
            bad[node] = ERROR_CHECK
            continue
        reason = rule_violation(node)
        if reason:
            bad[node] = reason
    if bad:  # host scalar arithmetic alone also means a graph cut (it sits next to a fallback)
        return bad, None, None
    prepared = prepare(gm)
    if prepared.num_program_outputs == 0:
        return {}, prepared, None
    try:
        return {}, prepared, lower_graph_cached(prepared.gm, platform=platform,
                                                precision=precision)
    except LoweringError as whole_graph_error:
        def lower_one(one):
            return lower_graph(prepare(one).gm, platform=platform, precision=precision)

        for node in gm.graph.nodes:
            reason = probe(node, lower_one)
            if reason:
                bad[node] = reason
        if not bad:
            raise LoweringError(
                f"the graph failed to lower although each of its ops lowers alone: "
                f"{whole_graph_error}") from whole_graph_error
        return bad, None, None


def build_static(gm: fx.GraphModule, precision: str, name: str,
                 resident_inputs: frozenset = frozenset()):
    """A runnable program for a graph with static shapes and tensor-only inputs.

    ``resident_inputs`` are positions of parameters and buffers, uploaded once and reused.
    """
    platform = get_client().platform
    normalize(gm)
    bad, prepared, lowered = _find_unsupported(gm, platform, precision)
    if not bad:
        return Program(gm, precision, name, prepared=prepared, lowered=lowered,
                       resident_inputs=resident_inputs)
    fallbacks = {node: reason for node, reason in bad.items()
                 if reason not in (HOST_SCALAR, COLLECTIVE, ERROR_CHECK)}
    collectives = [node for node, reason in bad.items() if reason is COLLECTIVE]
    if collectives:
        counters.add_dist("compiled_graph_collectives", len(collectives))
        log.info("torchtpu: graph %s is cut at %d collective op(s), which run through the "
                 "process group", name, len(collectives))
    for node, reason in fallbacks.items():
        if config.strict:
            raise UnsupportedOpError(
                f"TORCHTPU_STRICT=1: {describe(node)} cannot run through XLA ({reason}). "
                f"Unset TORCHTPU_STRICT to let it fall back to eager PyTorch.")
    if any(reason is ERROR_CHECK for reason in bad.values()):
        log.info("torchtpu: graph %s checks linalg errors on the host (as eager: a wait for the "
                 "device); the *_ex ops return the info instead", name)
    if fallbacks:
        counters.add("graphs_with_fallback")
    for node, reason in fallbacks.items():
        counters.count_fallback(op_name(node))
        warn_once(("fallback", op_name(node)),
                  "torchtpu: %s runs in eager PyTorch, not XLA: %s", describe(node), reason)
    return PartitionedProgram(gm, bad, name)


def _build_outside_fake(gm: fx.GraphModule, precision: str, name: str, resident_inputs):
    # Called at run time, but a region of a partitioned graph may be built while
    # aot_autograd's fake mode is active; constants and probes must be real.
    with unset_fake_temporarily():
        return build_static(gm, precision, name, resident_inputs)


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
    concrete = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    with torch.no_grad():
        traced = make_fx(fx.Interpreter(gm).run, tracing_mode="fake")(*concrete)
    for node, original in zip((n for n in traced.graph.nodes if n.op == "placeholder"), args):
        if not isinstance(original, torch.Tensor):
            node.meta["val"] = original
    return traced


class GraphRunner:
    """The callable aot_autograd gets for one graph (boxed: called with a list of args).

    Example::

        runner = GraphRunner(fx_graph_module, name="forward")
        outputs = runner([x, weight])
    """

    def __init__(self, gm: fx.GraphModule, name: str | None = None,
                 resident_inputs: frozenset = frozenset()):
        # An instance attribute, so that wrappers which copy __dict__ (torch._dynamo.disable,
        # around backward graphs) still tell aot_autograd we take boxed arguments.
        self._boxed_call = True
        self.gm = gm
        self.name = name or f"graph_{next(_graph_ids)}"
        pin_rng_state_sizes(gm)
        self.static = _is_static(gm)
        self.resident_inputs = resident_inputs
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
                program = build_static(gm, precision, label, self.resident_inputs)
            counters.record_compile(self.name, exact_shape=self._bucketed is False)
            self._programs[key] = program
        return program

    def _run_bucketed(self, args: list, precision: str):
        """Outputs from the graph's padded buckets, or None where it needs exact shapes."""
        from .buckets import BucketedGraph, NotPaddable
        if self._bucketed is None:
            self._bucketed = BucketedGraph(self.gm, self.name, _build_outside_fake,
                                           self.resident_inputs)
        try:
            return self._bucketed(args, precision)
        except NotPaddable as reason:
            self._bucketed = False
            warn_once(("exact_shape", self.name),
                      "torchtpu: %s compiles once per shape, not per bucket: %s", self.name,
                      reason)
            return None

    def __call__(self, *call_args) -> list:
        # aot_autograd calls forward graphs boxed (one list) and, through Dynamo's disable
        # wrapper, backward graphs with positional args; graph inputs are never lists.
        boxed = len(call_args) == 1 and type(call_args[0]) is list
        args = call_args[0] if boxed else list(call_args)
        precision = resolve_precision(self._platform)
        outputs = None
        if not self.static and config.buckets and self._bucketed is not False:
            outputs = self._run_bucketed(args, precision)
        if outputs is None:
            outputs = self._program_for(precision, args)(args)
        if boxed:
            args.clear()  # let inputs die as early as eager would
        return outputs
