"""Locate: the first ATen op whose torchtpu result diverges from eager PyTorch.

The model is compiled once more with the torchtpu backend, its graph compiler swapped for a
recorder: the ATen graphs torchtpu would lower (same forward/backward split; of the
decompositions, torch-mlir's, ours left out) are captured with the real inputs of each call,
and run eagerly. Then each graph is replayed with ``torch.fx.Interpreter`` on the reference
device; every op is also run alone through torchtpu (an op we decompose, decomposed: our
decomposition checked against eager's kernel) on exactly the reference's input values, so
errors never accumulate: the first op beyond tolerance is where the difference starts.

An op that picks elements (topk, sort, kthvalue, median, mode) may pick other ones among equal
values than eager did: eager PyTorch leaves that choice unspecified. Such a result is no error,
and the search goes on; when nothing else diverges, the first such op is reported as the cause
(``Divergence.ties``): the model's outputs depend on how ties are broken.

Views, ``getitem``, random ops, ``empty`` (uninitialized memory) and ops torchtpu cannot
lower (they run in eager PyTorch inside compiled graphs anyway) are not checked. Matmuls and
convolutions get the tolerance of the precision mode; every other op, whose result the mode does
not change, the ``highest`` one.

Example::

    divergence, note = locate_divergence(model, (x,), torch.device("cpu"), "highest",
                                         train=False, cotangents={})
    print(divergence.op, divergence.source_line)
"""
from __future__ import annotations

import collections
import operator
import re
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from .._logging import log
from ..lower.calling_convention import is_random
from ..lower.decompositions import decomposition_table, our_ops
from ..lower.support import op_name, rule_violation, single_op_graph, source_line
from .policy import compare_tensors, tolerance
from .report import Divergence
from .sides import Side, full_fp32, torchtpu_precision

aten = torch.ops.aten

#: Ops lowered to dot_general or convolution: the only ones the precision mode changes.
PRECISION_OPS = {
    aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default,
    aten.addbmm.default, aten.mv.default, aten.addmv.default, aten.dot.default,
    aten.convolution.default, aten._convolution.default, aten.convolution_backward.default,
}

#: Ops whose result is uninitialized memory: nothing to compare.
UNINITIALIZED_OPS = {
    aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
    aten.new_empty.default, aten.new_empty_strided.default,
}


#: Ops returning (values, indices) of elements they pick along ``dim``, whose choice among
#: equal values eager PyTorch leaves unspecified (torch.topk's and torch.median's docs, sort
#: without stable=True), with whether each index is picked once (a permutation's prefix).
TIE_OPS = {
    aten.topk.default: True, aten.sort.default: True, aten.sort.stable: True,
    aten.kthvalue.default: False, aten.median.dim: False, aten.nanmedian.dim: False,
    aten.mode.default: False,
}


@dataclass
class CapturedRun:
    """One call of one ATen graph: its label, the graph, and (copies of) its real inputs."""
    label: str
    gm: fx.GraphModule
    args: list


def capture(model_or_fn, inputs: tuple, train: bool, cotangents: dict) -> tuple:
    """Run the model through the torchtpu backend with a recording graph compiler.

    Returns the CapturedRuns in the order the graphs ran (forward before backward), and the
    result of that run: the captured program's, run by eager PyTorch on the CPU.
    """
    from .. import backend

    runs: list = []

    def recording_compiler(kind: str, graph_id: int, cached: bool = False):
        label = f"{kind} graph {graph_id}"

        def compile_graph(gm: fx.GraphModule, example_inputs):
            def run(*call_args):
                # Called boxed (one list) for forward graphs, positionally for backward ones.
                boxed = len(call_args) == 1 and type(call_args[0]) is list
                args = call_args[0] if boxed else list(call_args)
                runs.append(CapturedRun(label, gm, [_snapshot(a) for a in args]))
                outputs = list(gm(*args))
                if boxed:
                    args.clear()
                return outputs
            run._boxed_call = True
            return run
        return compile_graph

    from .. import config

    side = Side.build(model_or_fn, inputs, None, train)
    saved = backend._compiler, backend._decompositions
    torch._dynamo.reset()
    backend._compiler = recording_compiler
    backend._decompositions = lambda: decomposition_table(ours=False)
    # A graph-cache hit would hand back compiled graphs without calling our compiler: the
    # capture must see every graph being built.
    try:
        with config.patch(graph_cache=False):
            result, _ = side.run(torch.compile(side.fn, backend="torchtpu"), cotangents or None)
    finally:
        backend._compiler, backend._decompositions = saved
        torch._dynamo.reset()
    return runs, result


def _snapshot(value):
    # Inputs mutated after the graph (BatchNorm running stats) must be replayed as they were.
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


class _Found(Exception):
    def __init__(self, divergence: Divergence):
        self.divergence = divergence


def _fmt(value) -> str:
    if isinstance(value, fx.Node):
        value = value.meta.get("val")
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).replace('torch.', '')}{list(value.shape)}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return repr(value)


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def _checkable(node: fx.Node) -> bool:
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    if not isinstance(node.target, torch._ops.OpOverload):
        return False
    if node.target.is_view or node.target in UNINITIALIZED_OPS or is_random(node):
        return False
    if rule_violation(node):
        return False
    return bool(_tensors(node.meta.get("val")))


class NodeChecker(fx.Interpreter):
    """Replays a graph eagerly on ``device`` and checks each op against torchtpu alone."""

    def __init__(self, gm: fx.GraphModule, device: torch.device, precision: str, label: str,
                 programs: dict):
        super().__init__(gm)
        self.device = device
        self.precision = precision
        self.label = label
        self.programs = programs   # shared across graphs: signature -> Program or None
        self.ours = our_ops()      # decomposed alone, in _program
        self.checked = 0
        self.skipped = collections.Counter()   # op -> nodes that could not run alone
        self.ties = []   # Divergences that are only another choice among equal values

    def _to_device(self, value):
        if self.device.type == "cpu":
            return value
        if isinstance(value, torch.Tensor):
            return value.to(self.device)
        if isinstance(value, torch.device) and value.type == "cpu":
            return self.device  # the graph was traced on the CPU
        if isinstance(value, (list, tuple)):
            return type(value)(self._to_device(v) for v in value)
        if isinstance(value, dict):
            return {k: self._to_device(v) for k, v in value.items()}
        return value

    def placeholder(self, target, args, kwargs):
        return self._to_device(super().placeholder(target, args, kwargs))

    def get_attr(self, target, args, kwargs):
        return self._to_device(super().get_attr(target, args, kwargs))

    def call_function(self, target, args, kwargs):
        return super().call_function(target, self._to_device(args), self._to_device(kwargs))

    def run_node(self, node: fx.Node):
        value = super().run_node(node)
        if _checkable(node):
            self._check(node, value)
        return value

    def _program(self, node: fx.Node, args: list):
        from ..program import build_program

        key = _signature(node)
        if key not in self.programs:
            gm = single_op_graph(node)
            try:
                if node.target in self.ours:  # as the compiled graphs have it
                    gm = make_fx(gm, decomposition_table=decomposition_table(),
                                 tracing_mode="fake")(*args)
                self.programs[key] = build_program(gm, precision=self.precision,
                                                   name=f"locate/{op_name(node)}",
                                                   allow_fallback=False)
            except Exception as exc:  # does not lower: it would run in eager PyTorch anyway
                log.debug("locate: skipping %s: %s", op_name(node), exc)
                self.programs[key] = None
        return self.programs[key]

    def _check(self, node: fx.Node, value) -> None:
        args = [_on_host(self.env[arg]) for arg in node.all_input_nodes]
        program = self._program(node, args)
        if program is None:
            self.skipped[op_name(node)] += 1
            return
        outputs = program(args)
        self.checked += 1
        expected = _tensors(value)
        mode = self.precision if node.target in PRECISION_OPS else "highest"
        checks = []
        for i, (ours, ref) in enumerate(zip(outputs, expected)):
            name = node.name if len(expected) == 1 else f"{node.name}[{i}]"
            checks.append(compare_tensors(name, ours, ref, tolerance(mode, ref.dtype)))
        failed = [c for c in checks if not c.passed]
        if not failed:
            return
        ties = _tie_count(node, self.env, outputs, expected, checks)
        divergence = Divergence(
            graph=self.label, node=node.name, op=op_name(node),
            inputs=[_fmt(a) for a in node.args]
            + [f"{k}={_fmt(v)}" for k, v in node.kwargs.items()],
            outputs=[_fmt(t) for t in expected], check=failed[0],
            source_line=source_line(node), module=module_path(node), ties=ties)
        if not ties:
            raise _Found(divergence)
        # Each op runs on the reference's inputs: the ops after it see eager's choice, and
        # the search for an op that is really wrong goes on.
        self.ties.append(divergence)


def _schema_arguments(node: fx.Node, env: dict) -> dict:
    """The op's arguments by schema name, defaults filled in, nodes replaced by their values."""
    bound = {}
    for i, arg in enumerate(node.target._schema.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            value = node.args[i]
        elif arg.name in node.kwargs:
            value = node.kwargs[arg.name]
        else:
            value = arg.default_value if arg.has_default_value() else None
        bound[arg.name] = env[value] if isinstance(value, fx.Node) else value
    return bound


def _tie_count(node: fx.Node, env: dict, outputs: list, expected: list, checks: list) -> int:
    """For a TIE_OPS node whose values match and whose indices differ only by naming other
    positions of equal values (each once where the op picks each once): how many indices
    differ. 0 when the difference is anything else."""
    if node.target not in TIE_OPS or len(outputs) != 2 or not checks[0].passed:
        return 0
    bound = _schema_arguments(node, env)
    if bound.get("stable"):  # sort(stable=True): eager's order is the only right one
        return 0
    x, dim = bound["self"], bound.get("dim")
    values, indices = (_on_host(t) for t in expected)
    ours = _on_host(outputs[1])
    if dim is None or x.dim() == 0 or ours.dtype != torch.int64 or ours.shape != indices.shape:
        return 0
    x, dim = _on_host(x), dim % x.dim()
    if not bound.get("keepdim", True):
        ours, values = ours.unsqueeze(dim), values.unsqueeze(dim)
    if ((ours < 0) | (ours >= x.shape[dim])).any():
        return 0
    picked = x.gather(dim, ours)
    if not bool(((picked == values) | (picked.isnan() & values.isnan())).all()):
        return 0
    if TIE_OPS[node.target] and ours.shape[dim] > 1:
        ordered = ours.sort(dim).values
        if bool((ordered.narrow(dim, 1, ordered.shape[dim] - 1)
                 == ordered.narrow(dim, 0, ordered.shape[dim] - 1)).any()):
            return 0
    return int((_on_host(outputs[1]) != _on_host(expected[1])).sum())


_DYNAMO_ROOT = re.compile(r"^L\['[^']*'\]\.?")


def module_path(node: fx.Node) -> str:
    """The innermost module that ran ``node``, as a path from the model: ``"1 (Tanh)"``.

    Useful where there is no user source line (ops inside ``torch.nn`` modules).
    """
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, cls = list(stack.values())[-1]
    path = _DYNAMO_ROOT.sub("", str(path)) or "(the model)"
    return f"{path} ({getattr(cls, '__name__', cls)})"


def _differing_values(captured, expected, precision: str) -> list:
    """Names of the outputs, gradients and buffers where the captured program's own result
    differs from eager's beyond tolerance ([] without ``expected``)."""
    if expected is None:
        return []
    from .comparison import _check_group

    differing = []
    for group, shared_scale in (("outputs", False), ("grads", True), ("buffers", False)):
        ours = {k: _on_host(v) for k, v in getattr(captured, group).items()}
        theirs = {k: _on_host(v) for k, v in getattr(expected, group).items()}
        differing += [c.name for c in _check_group(ours, theirs, precision, shared_scale)
                      if not c.passed]
    return differing


def _on_host(value):
    return value.cpu() if isinstance(value, torch.Tensor) else value


def _signature(node: fx.Node) -> tuple:
    """Nodes with equal signatures make the same one-op program."""
    inputs = node.all_input_nodes

    def sig(value):
        if isinstance(value, fx.Node):
            return ("input", inputs.index(value), _fmt(value))
        if isinstance(value, (list, tuple)):
            return tuple(sig(v) for v in value)
        return repr(value)

    return (node.target, sig(node.args), sig(tuple(sorted(node.kwargs.items()))))


def locate_divergence(model_or_fn, inputs: tuple, device: torch.device, precision: str,
                      train: bool, cotangents: dict, expected=None):
    """(the first Divergence or None, a one-line note on what was checked).

    ``expected``, eager's result (``sides.Result``), lets the note tell a program that
    Dynamo captured differently from eager's (no op of ours at fault) from rounding that
    builds up."""
    runs, captured = capture(model_or_fn, inputs, train, cotangents)
    if not runs:
        return None, "Dynamo gave torchtpu no graph to check"
    programs: dict = {}
    checked, skipped, ties = 0, collections.Counter(), []
    with torchtpu_precision(precision):
        for run in runs:
            checker = NodeChecker(run.gm, device, precision, run.label, programs)
            try:
                with full_fp32(device):
                    checker.run(*run.args)
            except _Found as found:
                log.info("torchtpu numerics: %s", found.divergence)
                return found.divergence, f"checked {checker.checked + checked} ops"
            finally:
                checked += checker.checked
                skipped += checker.skipped
                ties += checker.ties
    if ties:
        log.info("torchtpu numerics: %s", ties[0])
        return ties[0], (f"checked {checked} ops in {len(runs)} graph runs: none diverges "
                         f"beyond tolerance on its own; {len(ties)} chose other elements "
                         f"among equal values than eager did")
    differing = _differing_values(captured, expected, precision)
    if differing:
        note = (f"checked {checked} ops in {len(runs)} graph runs and none diverges beyond "
                f"tolerance on its own, but the captured graphs, run by eager PyTorch itself, "
                f"already differ from eager in {', '.join(differing[:3])}: torch.compile "
                f"captured another program than eager runs (a branch on "
                f"torch.compiler.is_compiling(), or a value read once at trace time)")
    else:
        note = (f"checked {checked} ops in {len(runs)} graph runs and none diverges beyond "
                f"tolerance on its own: the difference builds up over many ops")
    if skipped:
        note += f" (not checked: {dict(skipped)})"
    return None, note
