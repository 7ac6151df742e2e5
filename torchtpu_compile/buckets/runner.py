"""Run a graph with dynamic sizes through a few padded, statically compiled buckets.

Per call: bind the size symbols from the arguments, pick the bucket (policy.py), pad the
inputs, run the bucket's program with the real sizes as extra scalar arguments, and cut the
outputs back to their real sizes.

Example::

    def build(static_gm, precision, label, resident, **options):
        return build_program(static_gm, precision=precision, name=label,
                             resident_inputs=resident, **options)

    graph = BucketedGraph(gm, "graph_0/forward", build=build)
    outputs = graph(args, precision="highest")
"""
from __future__ import annotations

import math

import sympy
import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .. import config, counters
from .._logging import log
from ..host_semantics import host_factories
from ..profiling import trace_artifact
from ..runtime.transfer import keep_aliased
from .layout import (DimsDiffer, NotPaddable, canonical_factors, has_padding, holding,
                     outputs_plan, pad_plan, pad_with)
from .background import compile_ahead
from .kept_padding import KeptPadding, handed_back
from .policy import choose, next_bucket
from .trace import analyze, size_binding, trace_bucket
from .write_back import outputs_written, write_plans


class SizesDiffer(Exception):
    """Two sizes the graph's buckets assume equal (``InputSpec.aliases``) differ at this
    call: it runs a program of its exact shapes instead."""


# Layouts of the tensors a forward graph returns, by node name, per backend graph ("graph_3"):
# its backward graph takes the saved ones as inputs under the same names.
_SAVED_LAYOUTS: dict = {}
# Sizes a forward graph's buckets take as equal (InputSpec.aliases), per backend graph: its
# backward's saved tensors have the layouts those name.
_SAVED_ALIASES: dict = {}
#: Sizes a graph remembers how to call (a bound on memory for graphs called at many sizes).
_MAX_CALL_PLANS = 4096


def _family(name: str) -> str:
    return name.split("/", 1)[0]


class _CallShapes:
    """How a call at one set of real sizes pads its inputs and cuts its outputs back, worked
    out at the first such call: ``kept`` and ``fresh``, (input position, ``pad_plan``) of the
    inputs padded into a kept tensor and into a new one; the element counts the bucket
    statistics take; ``outputs`` and ``written``, the outputs plan and write plans, once the
    first results are there."""

    __slots__ = ("kept", "fresh", "padded_elements", "real_elements", "outputs", "written")

    def __init__(self, padded: list, inputs: list, real_env: dict, pad_env: dict):
        plans = [(j, pad_plan(layout, real_env, pad_env, inputs[j].shape), keep)
                 for j, layout, keep in padded]
        self.kept = [(j, p, tuple(p[0]), tuple(p[1])) for j, p, keep in plans
                     if keep and p is not None]
        self.fresh = [(j, p) for j, p, keep in plans if not keep and p is not None]
        self.real_elements = sum(inputs[j].numel() for j, _, _ in plans)
        self.padded_elements = sum(
            math.prod(p[3]) if p is not None else inputs[j].numel() for j, p, _ in plans)
        self.outputs = None
        self.written = ()


def _renamed_symbol(a, b) -> tuple:
    """(x, y) where one size is the other with a symbol x renamed y (``s51 - 1`` against
    ``s54 - 1``; a diagonal's ``Min(s52, s97)`` against ``s97``, the logits of two inputs'
    batches beside the batch), the size of the renamed one of one symbol; else (None, None)."""
    a, b = sympy.sympify(a), sympy.sympify(b)
    for first, one in ((a, b), (b, a)):
        if len(one.free_symbols) != 1:
            continue
        (y,) = one.free_symbols
        for x in sorted(first.free_symbols - {y}, key=str):
            if first.xreplace({x: y}) == one:
                return x, y
    return None, None


class BucketedGraph:
    """The programs of one symbolic graph, one per bucket (and precision).

    Sizes that only some expression no rule evaluates on padded sizes reads (the
    ``1 / sqrt(head_dim)`` of an attention's default scale under ``dynamic=True``) are held
    at their real values: one ``BucketedGraph`` per value of them (``held``), whose other
    sizes pick buckets."""

    def __init__(self, gm, name: str, build, resident_inputs: frozenset = frozenset(),
                 mutated_inputs: tuple = (), held: dict | None = None):
        self.gm = gm
        # symbol -> real value, for a graph of one value of the held sizes; None at the top
        self.held = held
        self._holds: tuple = ()     # the held symbols, sorted (the top graph)
        self._held_at: list = []    # where a call's value of each is (size_binding)
        self._by_value: dict = {}   # their values -> the BucketedGraph serving them
        self.name = name
        # (static gm, precision, label, resident, **build_program options) -> program
        self._build = build
        self.resident_inputs = resident_inputs
        # (graph input, graph output) pairs: inputs the graph overwrites (write_back.py)
        self.mutated_inputs = tuple(mutated_inputs)
        self._kept = KeptPadding()
        self.spec = None
        self._programs: dict = {}   # (precision, bucket key) -> (program, plan)
        self._device = False        # the results' device type (None: as traced), once known
        self._calls: dict = {}      # (precision, real sizes) -> _call_plan's tuple
        self._shapes: dict = {}     # (precision, real sizes) -> _CallShapes
        self._sizes: dict = {}      # real size -> its scalar input (_size_input)

    def _analyze(self, aliases: dict | None = None):
        if self.spec is None:
            family = _family(self.name)
            if aliases is None:
                aliases = _SAVED_ALIASES.get(family, {})
            self.spec = analyze(self.gm, _SAVED_LAYOUTS.get(family, {}), aliases)
            if self.spec.aliases:
                _SAVED_ALIASES.setdefault(family, {}).update(self.spec.aliases)
        return self.spec

    def _assume_equal(self, differ: DimsDiffer, args: list) -> None:
        """Take the symbols of two dims an op combines as equal, where each pair differs only
        in its symbol and the sizes are equal at this call, or raise ``differ``. Dynamo names
        the batch and length of a model's logits and of its labels apart when the loss runs
        after a graph break (GPT-2's), and guards only their products equal: the loss's
        backward combines the two flattened dims."""
        first, other = differ.dims
        real = self._bind(args)
        parent = dict(self.spec.aliases)

        def root(symbol):
            while symbol in parent:
                symbol = parent[symbol]
            return symbol
        ours, theirs = canonical_factors(first.factors), canonical_factors(other.factors)
        if len(ours) != len(theirs):
            raise differ
        for a, b in zip(ours, theirs):
            if a == b:
                continue
            # the same size of one symbol each, spelled by two (``s51 - 1`` and ``s54 - 1``)
            a, b = _renamed_symbol(a, b)
            if a is None or real.get(a) is None or real.get(a) != real.get(b):
                raise differ
            a, b = sorted((root(a), root(b)), key=str)
            if a != b:
                parent[b] = a
        if parent == self.spec.aliases:
            raise differ
        aliases = {symbol: root(symbol) for symbol in parent}
        log.debug("torchtpu: %s: sizes taken as equal, checked at each call: %s", self.name,
                  aliases)
        self.spec = None
        self._analyze(aliases)
        self._programs.clear()
        self._calls.clear()
        self._shapes.clear()

    def _bind(self, args) -> dict:
        real = {}
        for symbol, (index, dim) in self.spec.binding.items():
            arg = args[index]
            real[symbol] = int(arg.shape[dim] if dim is not None else arg)
        return real

    def _program_for(self, precision: str, key: tuple, pad_env: dict):
        entry = self._programs.get((precision, key))
        if entry is not None:
            return entry
        return self._build_bucket(precision, key, pad_env, self._build)

    def _build_bucket(self, precision: str, key: tuple, pad_env: dict, build):
        with unset_fake_temporarily(), host_factories():
            plan = trace_bucket(self.gm, self.spec, pad_env)
        tensor_positions = [i for i, k in enumerate(self.spec.kinds) if k == "tensor"]
        resident = frozenset(j for j, i in enumerate(tensor_positions)
                             if i in self.resident_inputs)
        label = f"{self.name}[bucket {','.join(map(str, key))}]"
        log.debug("building %s at precision %s", label, precision)
        program = build(plan.gm, precision, label, resident)
        family = _SAVED_LAYOUTS.setdefault(_family(self.name), {})
        family.update(plan.named_layouts)
        entry = (program, plan)
        self._programs[(precision, key)] = entry
        return entry

    def _call_plan(self, precision: str, sizes: tuple, real_env: dict) -> tuple:
        """(program, plan, pad_env, tensor positions, padded ones with their layouts, sizes,
        bucket key) for real ``sizes``, choosing (and building) the bucket on first sight."""
        spec = self.spec
        existing = [k for (p, k) in self._programs if p == precision]
        key, new = choose(sizes, existing)
        pad_env = dict(zip(spec.symbols, key))
        if new:
            largest = max((max(k) for k in existing), default=0)
            level = log.info if existing and max(key) > largest else log.debug
            level("torchtpu: %s: new bucket %s for sizes %s (%d buckets before)", self.name,
                  key, sizes, len(existing))
            # Another bucket can change which one serves sizes seen before (policy.choose).
            self._calls.clear()
            self._shapes.clear()
        program, plan = self._program_for(precision, key, pad_env)
        if config.background_buckets:  # also at the first use of a bucket built ahead
            self._build_next_ahead(precision, key, len(existing) + new)
        tensors = [i for i, kind in enumerate(spec.kinds) if kind == "tensor"]
        # Inputs padded into a tensor kept across calls (kept_padding.py): not where an output
        # could show it, nor where results stay on a device (the program may still run).
        shown = handed_back(program) if self._result_device() is None else None
        padded = [(j, spec.layouts[i], shown is not None and j not in shown)
                  for j, i in enumerate(tensors) if has_padding(spec.layouts[i])]
        # The size inputs, after the tensors: kept too where no output can show them.
        sizes_kept = shown is not None and all(j < len(tensors) for j in shown)
        return (program, plan, pad_env, tensors, padded, sizes, key, sizes_kept), new

    def _build_next_ahead(self, precision: str, key: tuple, buckets: int) -> None:
        """Build the bucket after ``key`` (each size's next canonical bucket), its XLA compile
        in the background (background.py), if the graph has room for it below
        ``config.max_buckets`` (whose last slot stays for the bucket covering every size)."""
        ahead = tuple(next_bucket(k) for k in key)
        if buckets + 1 >= int(config.max_buckets) or (precision, ahead) in self._programs:
            return
        def build(gm, precision, label, resident):
            return self._build(gm, precision, label, resident, compile=compile_ahead)

        self._build_bucket(precision, ahead, dict(zip(self.spec.symbols, ahead)), build)
        counters.record_bucket_call(self.name, ahead, True, 0, 0, ahead=True)
        log.debug("torchtpu: %s: bucket %s built ahead", self.name, ahead)

    def __call__(self, args: list, precision: str) -> list:
        """The graph's outputs for ``args``; raises NotPaddable where no bucket can serve the
        graph, SizesDiffer where none can serve this call."""
        if self.held is not None:
            with holding(self.held):
                return self._call_retrying(args, precision)
        # each retry holds more symbols exact; there are finitely many
        while True:
            try:
                if self._holds:
                    return self._call_held(args, precision)
                return self._call_retrying(args, precision)
            except NotPaddable as reason:
                self._hold(reason)

    def _call_retrying(self, args: list, precision: str) -> list:
        # each retry takes one more pair of symbols as equal; there are finitely many
        while True:
            try:
                return self._call(args, precision)
            except DimsDiffer as differ:
                self._assume_equal(differ, args)

    def _hold(self, reason: NotPaddable) -> None:
        """Hold the symbols ``reason`` names exact from now on, or raise it where it names
        none, one that no input's size is, or every size the graph has (the graph then
        compiles per exact shape, as it would held)."""
        binding = size_binding(self.gm)
        symbols = set(reason.symbols).union(self._holds)
        if not reason.symbols or not symbols <= binding.keys() or self.spec is None or \
                not set(self.spec.symbols) - symbols:
            raise reason
        self._holds = tuple(sorted(symbols, key=str))
        self._held_at = [binding[s] for s in self._holds]
        self._by_value.clear()
        self._programs.clear()
        self._calls.clear()
        self._shapes.clear()
        log.info("torchtpu: %s: sizes %s held exact, buckets per value of them: %s",
                 self.name, ", ".join(map(str, self._holds)), reason)

    def _call_held(self, args: list, precision: str) -> list:
        values = tuple(int(args[i].shape[d] if d is not None else args[i])
                       for i, d in self._held_at)
        graph = self._by_value.get(values)
        if graph is None:
            # the held sizes vary like the others: compile per exact shape, as without them
            if len(self._by_value) >= int(config.max_buckets):
                raise NotPaddable(f"sizes {', '.join(map(str, self._holds))}, held exact, "
                                  f"took more than config.max_buckets values")
            graph = self._by_value[values] = BucketedGraph(
                self.gm, self.name, self._build, self.resident_inputs, self.mutated_inputs,
                held=dict(zip(self._holds, values)))
        return graph(args, precision)

    def _call(self, args: list, precision: str) -> list:
        spec = self._analyze()
        real_env = self._bind(args)
        for symbol, same in spec.aliases.items():
            if real_env[symbol] != real_env[same]:
                raise SizesDiffer(f"{symbol} = {real_env[symbol]} and {same} = "
                                  f"{real_env[same]}, which its buckets take as equal")
        sizes = tuple(real_env[s] for s in spec.symbols)
        # A decode loop calls with the same few sizes again and again: what they need (bucket,
        # program, which inputs to pad) is worked out once per sizes.
        call = self._calls.get((precision, sizes))
        new = False
        if call is None:
            call, new = self._call_plan(precision, sizes, real_env)
            if len(self._calls) >= _MAX_CALL_PLANS:
                self._calls.clear()
                self._shapes.clear()
            self._calls[(precision, sizes)] = call
        program, plan, pad_env, tensors, padded, sizes, key, sizes_kept = call
        inputs = [args[i] for i in tensors]
        # How each input is padded and each output cut back, per sizes: shapes from the
        # layouts' size expressions, evaluated once, not at every step of a decode loop.
        shapes = self._shapes.get((precision, sizes))
        if shapes is None:
            shapes = self._shapes[(precision, sizes)] = _CallShapes(padded, inputs, real_env,
                                                                    pad_env)
        for j, pad_as in shapes.fresh:
            inputs[j] = pad_with(inputs[j], pad_as)
        self._kept.pad_all(inputs, shapes.kept)
        padded_elements, real_elements = shapes.padded_elements, shapes.real_elements
        if sizes_kept:
            inputs += [self._size_input(size) for size in sizes]
        else:  # fresh each call: an output may be one of them, handed to the caller
            inputs += [torch.scalar_tensor(size, dtype=torch.int64) for size in sizes]
        counters.record_bucket_call(self.name, key, new, padded_elements, real_elements)
        if new:  # the decision, for TORCH_TRACE (profiling.py); each call is in stats()
            others = sum(1 for (p, k) in self._programs if p == precision and k != key)
            trace_artifact("torchtpu_bucket", lambda: {
                "graph": self.name, "precision": precision, "dims": [str(s) for s in spec.symbols],
                "sizes": list(sizes), "bucket": list(key), "buckets_before": others,
                "padded_elements": padded_elements, "real_elements": real_elements})
        results = program(inputs, self._result_device())
        if shapes.outputs is None:
            shapes.outputs = outputs_plan(results, plan.outputs, real_env, pad_env)
            shapes.written = write_plans(shapes.outputs, self.mutated_inputs)
        return outputs_written(results, shapes.outputs, shapes.written, args)

    def _size_input(self, size: int) -> torch.Tensor:
        """The int64 scalar input of real size ``size``, one tensor per value, its buffer kept
        (``transfer.keep_aliased``): a decode step found it instead of uploading it. Only
        this graph's calls see it (``_call_plan``'s ``sizes_kept``), and no program writes
        its inputs but the ones it overwrites, which sizes are not."""
        tensor = self._sizes.get(size)
        if tensor is None:
            if len(self._sizes) >= _MAX_CALL_PLANS:
                self._sizes.clear()
            tensor = self._sizes[size] = torch.scalar_tensor(size, dtype=torch.int64)
            keep_aliased(tensor)
        return tensor

    def _result_device(self) -> str | None:
        # A bucket is traced on the host (trace.py), so its program would hand back host
        # tensors; a graph compiled on tpu tensors gives tpu tensors, as unbucketed.
        if self._device is False:
            outputs = self.gm.graph.output_node().args[0]
            devices = {n.meta["val"].device.type for n in outputs
                       if isinstance(n, torch.fx.Node)
                       and isinstance(n.meta.get("val"), torch.Tensor)}
            self._device = next((d for d in devices if d != "cpu"), None)
        return self._device


__all__ = ["BucketedGraph", "NotPaddable", "SizesDiffer"]
