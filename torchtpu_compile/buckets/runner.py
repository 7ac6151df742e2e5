"""Run a graph with dynamic sizes through a few padded, statically compiled buckets.

Per call: bind the size symbols from the arguments, pick the bucket (policy.py), pad the
inputs, run the bucket's program with the real sizes as extra scalar arguments, and cut the
outputs back to their real sizes.

Example::

    def build(static_gm, precision, label, resident):
        return build_program(static_gm, precision=precision, name=label,
                             resident_inputs=resident)

    graph = BucketedGraph(gm, "graph_0/forward", build=build)
    outputs = graph(args, precision="highest")
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .. import counters
from .._logging import log
from ..profiling import trace_artifact
from .layout import NotPaddable, has_padding, pad, unpad_outputs
from .policy import choose
from .trace import analyze, trace_bucket

# Layouts of the tensors a forward graph returns, by node name, per backend graph ("graph_3"):
# its backward graph takes the saved ones as inputs under the same names.
_SAVED_LAYOUTS: dict = {}


def _family(name: str) -> str:
    return name.split("/", 1)[0]


class BucketedGraph:
    """The programs of one symbolic graph, one per bucket (and precision)."""

    def __init__(self, gm, name: str, build, resident_inputs: frozenset = frozenset()):
        self.gm = gm
        self.name = name
        self._build = build  # (static gm, precision, label, resident) -> program
        self.resident_inputs = resident_inputs
        self.spec = None
        self._programs: dict = {}   # (precision, bucket key) -> (program, plan)
        self._device = False        # the results' device type (None: as traced), once known

    def _analyze(self):
        if self.spec is None:
            self.spec = analyze(self.gm, _SAVED_LAYOUTS.get(_family(self.name), {}))
        return self.spec

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
        with unset_fake_temporarily():
            plan = trace_bucket(self.gm, self.spec, pad_env)
        tensor_positions = [i for i, k in enumerate(self.spec.kinds) if k == "tensor"]
        resident = frozenset(j for j, i in enumerate(tensor_positions)
                             if i in self.resident_inputs)
        label = f"{self.name}[bucket {','.join(map(str, key))}]"
        log.debug("building %s at precision %s", label, precision)
        program = self._build(plan.gm, precision, label, resident)
        family = _SAVED_LAYOUTS.setdefault(_family(self.name), {})
        family.update(plan.named_layouts)
        entry = (program, plan)
        self._programs[(precision, key)] = entry
        return entry

    def __call__(self, args: list, precision: str) -> list:
        spec = self._analyze()
        real_env = self._bind(args)
        sizes = tuple(real_env[s] for s in spec.symbols)
        existing = [k for (p, k) in self._programs if p == precision]
        key, new = choose(sizes, existing)
        pad_env = dict(zip(spec.symbols, key))
        if new:
            largest = max((max(k) for k in existing), default=0)
            level = log.info if existing and max(key) > largest else log.debug
            level("torchtpu: %s: new bucket %s for sizes %s (%d buckets before)", self.name,
                  key, sizes, len(existing))
        program, plan = self._program_for(precision, key, pad_env)
        inputs, padded_elements, real_elements = [], 0, 0
        for arg, kind, layout in zip(args, spec.kinds, spec.layouts):
            if kind != "tensor":
                continue
            padded = pad(arg, layout, real_env, pad_env)
            if has_padding(layout):
                padded_elements += padded.numel()
                real_elements += arg.numel()
            inputs.append(padded)
        inputs += [torch.tensor(real_env[s], dtype=torch.int64) for s in spec.symbols]
        counters.record_bucket_call(self.name, key, new, padded_elements, real_elements)
        if new:  # the decision, for TORCH_TRACE (profiling.py); each call is in stats()
            trace_artifact("torchtpu_bucket", lambda: {
                "graph": self.name, "precision": precision, "dims": [str(s) for s in spec.symbols],
                "sizes": list(sizes), "bucket": list(key), "buckets_before": len(existing),
                "padded_elements": padded_elements, "real_elements": real_elements})
        return unpad_outputs(program(inputs, self._result_device()), plan.outputs, real_env,
                             pad_env)

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


__all__ = ["BucketedGraph", "NotPaddable"]
