"""Ahead-of-time compilation: model or ExportedProgram -> Artifact (in memory, then saved).

This side needs torch.export and torch-mlir; the loader (``loader.py``) needs neither.
"""
from __future__ import annotations

import collections
import json
import re
from dataclasses import dataclass, field

import torch
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree

from ..errors import LoweringError
from . import artifact_file, specs


@dataclass
class Artifact:
    """A compiled model that can be saved and loaded later without recompiling.

    Example::

        artifact = torchtpu_compile.aot.compile(model, (tokens,))
        artifact.save("model.tpu")
        run = torchtpu_compile.aot.load("model.tpu")
        logits = run(tokens)
    """
    manifest: dict
    portable_stablehlo: bytes
    executables: dict                      # platform -> serialized executable
    state: dict                            # name -> tensor (parameters, buffers, constants)
    example_inputs: dict = field(default_factory=dict)

    def save(self, path: str) -> str:
        """Write the artifact to ``path`` (atomically) and return the path."""
        from safetensors.torch import save

        unique, aliases = _dedupe_tied(self.state)
        manifest = {**self.manifest, "state_aliases": aliases}
        members = {
            "manifest.json": json.dumps(manifest, indent=1).encode(),
            "stablehlo.portable": self.portable_stablehlo,
            "params.safetensors": save(unique),
        }
        for platform, blob in self.executables.items():
            members[f"executables/{platform}.bin"] = blob
        if self.example_inputs:
            members["example_inputs.safetensors"] = save(
                {k: v.contiguous() for k, v in self.example_inputs.items()})
        artifact_file.write_members(path, members)
        return path


def _dedupe_tied(state: dict) -> tuple[dict, dict]:
    """Store tied weights (lm_head = embedding) once; return (tensors, alias -> stored name)."""
    unique, aliases, seen = {}, {}, {}
    for name, tensor in state.items():
        identity = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
                    tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        if identity in seen:
            aliases[name] = seen[identity]
            continue
        seen[identity] = name
        unique[name] = tensor.contiguous()
    # Views of one storage that are not the same tensor must not share memory on disk.
    storages = collections.Counter(t.untyped_storage().data_ptr() for t in unique.values())
    for name, tensor in unique.items():
        if storages[tensor.untyped_storage().data_ptr()] > 1:
            unique[name] = tensor.clone()
    return unique, aliases


_OP = re.compile(r"\b(stablehlo\.[a-z_]+)")


def _op_counts(text: str) -> dict:
    return dict(collections.Counter(_OP.findall(text)).most_common())


def _export(model, example_args, example_kwargs):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..lower.decompositions import decomposition_table
    if isinstance(model, torch.export.ExportedProgram):
        exported = model
    else:
        if isinstance(model, torch.nn.Module):
            model.eval()
        # The fused CPU attention kernels neither decompose cleanly nor lower (STACK-NOTES).
        with sdpa_kernel(SDPBackend.MATH):
            exported = torch.export.export(model, tuple(example_args), example_kwargs or None,
                                           strict=False)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        return exported.run_decompositions(decomposition_table())


def compile(model, example_args=(), example_kwargs=None, precision: str | None = None,
            keep_example_inputs: bool = True) -> Artifact:
    """Export ``model`` (an nn.Module, function or ExportedProgram) and compile it ahead of time.

    The artifact holds portable StableHLO, the executable for this process's platform, the
    parameters, and the input/output specs. ``precision`` defaults to the one in force now.

    Example::

        artifact = compile(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
    """
    from ..lower import lower_graph
    from ..lower.calling_convention import prepare
    from ..lower.fx_passes import normalize
    from ..lower.precision import resolve_precision
    from ..runtime.client import get_client
    from ..runtime.executable import compile_stablehlo
    from jaxlib.mlir.dialects import stablehlo

    example_args = tuple(example_args)
    example_kwargs = dict(example_kwargs or {})
    exported = _export(model, example_args, example_kwargs)
    signature = exported.graph_signature
    for out in signature.output_specs:
        if out.kind != OutputKind.USER_OUTPUT:
            raise LoweringError(
                f"the exported program mutates {out.target!r} ({out.kind.name}); AOT artifacts "
                f"are for inference: call model.eval() (BatchNorm statistics) and export again")

    client = get_client()
    precision = precision or resolve_precision(client.platform)
    gm = exported.graph_module
    normalize(gm)
    prepared = prepare(gm)
    if prepared.random_inputs:
        raise LoweringError("the exported program draws random numbers (dropout in train "
                            "mode?); call model.eval() before exporting")

    flat_user, in_spec = pytree.tree_flatten((example_args, example_kwargs))
    user_names = list(signature.user_inputs)
    if len(flat_user) != len(user_names) or not all(isinstance(t, torch.Tensor) for t in flat_user):
        raise LoweringError("AOT artifacts take tensor inputs only; got "
                            + ", ".join(type(t).__name__ for t in flat_user))

    state_values = {**exported.state_dict, **exported.constants}
    arguments, state = [], {}
    for index, spec in enumerate(signature.input_specs):
        if spec.kind == InputKind.USER_INPUT:
            arguments.append({"kind": "input", "index": user_names.index(spec.arg.name)})
        else:
            state[spec.target] = state_values[spec.target].detach()
            arguments.append({"kind": "state", "name": spec.target})
    program_arguments = [arguments[i] for i in prepared.arg_indices]
    for i, value in enumerate(prepared.constants):
        state[f"__lifted_constant_{i}"] = value
        program_arguments.append({"kind": "state", "name": f"__lifted_constant_{i}"})

    lowered = lower_graph(prepared.gm, platform=client.platform, precision=precision)
    executable = compile_stablehlo(lowered.bytecode, lowered.fingerprint, precision,
                                   what="AOT artifact")
    target = stablehlo.get_current_version()
    portable = stablehlo.serialize_portable_artifact_str(lowered.text, target)

    slots = []
    for slot in prepared.outputs:
        if slot.kind == "input":  # an output that is an input or a parameter, unchanged
            argument = arguments[slot.index]
            slots.append({"kind": "user_input", "index": argument["index"]}
                         if argument["kind"] == "input" else argument)
        elif slot.kind == "constant":
            slots.append({"kind": "constant", "value": slot.value})
        else:
            slots.append({"kind": slot.kind, "index": slot.index})
    out_values = [n.meta["val"] for n in prepared.gm.graph.output_node().args[0]]
    out_spec = exported.call_spec.out_spec
    manifest = {
        "format": artifact_file.FORMAT,
        "format_version": artifact_file.FORMAT_VERSION,
        "inputs": [specs.tensor_spec(name, t) for name, t in zip(user_names, flat_user)],
        "in_spec": specs.dump_treespec(in_spec),
        "out_spec": specs.dump_treespec(out_spec),
        "program_arguments": program_arguments,
        "program_outputs": [specs.tensor_spec(f"output_{i}", v) for i, v in enumerate(out_values)],
        "output_slots": slots,
        "dynamic_dims": [],  # bounded dynamism (buckets) is not part of artifacts yet
        "precision": precision,
        "fingerprint": lowered.fingerprint,
        "stablehlo_version": target,
        "stablehlo_op_counts": _op_counts(lowered.text),
        "executables": {client.platform: {"platform_version": client.pjrt.platform_version,
                                          "jaxlib": specs.versions()["jaxlib"]}},
        "versions": specs.versions(),
    }
    if manifest["out_spec"] is None:
        manifest["out_type"] = type(pytree.tree_unflatten(
            [None] * out_spec.num_leaves, out_spec)).__name__
    example = {}
    if keep_example_inputs:
        example = {spec["name"]: t.detach() for spec, t in zip(manifest["inputs"], flat_user)}
    return Artifact(manifest=manifest, portable_stablehlo=portable,
                    executables={client.platform: executable.serialize()},
                    state=state, example_inputs=example)
