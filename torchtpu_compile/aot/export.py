"""Ahead-of-time compilation: model or ExportedProgram -> Artifact (in memory, then saved).

Each graph (one, or one per bucket) goes through the one program builder
(``program/build.py``, no fallback) and is serialized: its calling convention into the
manifest, its StableHLO as a portable artifact, its executable as PJRT's bytes. This side needs
torch.export and torch-mlir; the loader (``loader.py``) needs neither.
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
    portable_stablehlo: dict               # program name -> portable StableHLO
    executables: dict                      # platform -> program name -> serialized executable
    state: dict                            # name -> tensor (parameters, buffers, constants)
    example_inputs: dict = field(default_factory=dict)

    def save(self, path: str) -> str:
        """Write the artifact to ``path`` (atomically) and return the path."""
        from safetensors.torch import save

        unique, aliases = _dedupe_tied(self.state)
        manifest = {**self.manifest, "state_aliases": aliases}
        members = {
            "manifest.json": json.dumps(manifest, indent=1).encode(),
            "params.safetensors": save(unique),
        }
        for name, portable in self.portable_stablehlo.items():
            members[artifact_file.portable_member(name)] = portable
        for platform, programs in self.executables.items():
            for name, blob in programs.items():
                members[artifact_file.executable_member(platform, name)] = blob
        if self.example_inputs:
            members["example_inputs.safetensors"] = save(
                {k: v.contiguous() for k, v in self.example_inputs.items()})
        artifact_file.write_members(path, members)
        return path


def _unaliased(tree):
    """``tree`` with every tensor that shares memory with an earlier one cloned.

    torch.export traces inputs that are one tensor (``f(a, a)``) as one value: the program
    reads one placeholder for both, and called with two different tensors it gives a wrong
    answer. Exported from separate copies, it computes the same on aliased inputs and the
    right thing on distinct ones; AOT programs do not mutate their inputs, so nothing else
    depends on the aliasing. (It also lets safetensors save the example inputs.)
    """
    seen = set()

    def separate(value):
        if not isinstance(value, torch.Tensor):
            return value
        storage = value.untyped_storage().data_ptr()
        if storage in seen:
            return value.clone()
        seen.add(storage)
        return value
    return pytree.tree_map(separate, tree)


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


class _Function(torch.nn.Module):
    """A plain function as the module torch.export takes."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def _input_name(path) -> str:
    """A leaf of ``(args, kwargs)`` as a user calls it: "keyword 'use_cache'", "argument 0[2]"."""
    top, first, *rest = path
    inner = pytree.keystr(tuple(rest))
    if top.idx == 1:
        return f"keyword {first.key!r}{inner}"
    return f"argument {first.idx}{inner}"


def _export(model, example_args, example_kwargs, dynamic_shapes):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..lower.decompositions import decomposition_table
    if isinstance(model, torch.export.ExportedProgram):
        exported = model
    else:
        modes = {}
        if isinstance(model, torch.nn.Module):
            # Exported in eval mode, then given back as it came: a model exported between
            # training steps kept dropout off and BatchNorm statistics frozen.
            modes = {module: module.training for module in model.modules()}
            model.eval()
        elif callable(model):
            model = _Function(model)
        # The fused CPU attention kernels (flash, efficient) neither decompose cleanly nor
        # lower through torch-mlir; the math kernel decomposes into matmuls and a softmax.
        try:
            with sdpa_kernel(SDPBackend.MATH):
                exported = torch.export.export(model, tuple(example_args),
                                               example_kwargs or None,
                                               dynamic_shapes=dynamic_shapes, strict=False)
        finally:
            for module, training in modes.items():
                module.training = training
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        return exported.run_decompositions(decomposition_table())


@dataclass
class _Built:
    """One compiled program of an artifact: its manifest entry and its payloads."""
    entry: dict
    portable: bytes
    executable: bytes
    constants: dict


def _build_program(name: str, gm, graph_arguments: list, precision: str, client,
                   bucketed: bool) -> _Built:
    """Build one static graph through the one builder and serialize it; ``graph_arguments``
    says what feeds each of its placeholders (a user input, a state tensor, or a size);
    ``bucketed``: the program serves a bucket (its outputs are cut back, not restrided)."""
    from jaxlib.mlir.dialects import stablehlo

    from ..program import build_program

    # No fallback: an artifact runs whole on the device or is refused, naming the op. Every
    # output of an exported graph is the user's: with eager's strides, as compiled calls'
    # (a bucket's outputs are cut back into contiguous copies).
    outputs = gm.graph.output_node().args[0]
    users = tuple(range(len(outputs))) if not bucketed and \
        isinstance(outputs, (tuple, list)) else ()
    program = build_program(gm, precision=precision, name=f"AOT artifact program {name}",
                            platform=client.platform, allow_fallback=False, skip_empty=False,
                            eager_layouts=users)
    prepared, lowered = program.prepared, program.lowered
    if prepared.random_inputs:
        raise LoweringError("the exported program draws random numbers (dropout in train "
                            "mode?); call model.eval() before exporting")
    constants = {f"__lifted_constant_{name}_{i}": value
                 for i, value in enumerate(prepared.constants)}
    target = stablehlo.get_current_version()
    out_values = [n.meta["val"] for n in prepared.gm.graph.output_node().args[0]]
    entry = {
        "name": name,
        "graph_arguments": graph_arguments,
        "arg_indices": prepared.arg_indices,
        "constants": list(constants),
        "output_slots": [slot.to_json() for slot in prepared.outputs],
        "program_outputs": [specs.tensor_spec(f"output_{i}", v)
                            for i, v in enumerate(out_values)],
        "fingerprint": lowered.fingerprint,
        "stablehlo_op_counts": _op_counts(lowered.text),
    }
    return _Built(entry, stablehlo.serialize_portable_artifact_str(lowered.text, target),
                  program.executable.serialize(), constants)


def _dynamic_programs(exported, gm, graph_arguments: list, user_names: list):
    """(dynamic dim records, [(name, static gm, its graph arguments, bucket, plan outputs)])
    for a program with size symbols: one static graph per bucket."""
    from ..buckets.layout import NotPaddable
    from ..buckets.trace import analyze, trace_bucket
    from . import dynamic

    try:
        spec = analyze(gm, {})
    except NotPaddable as exc:
        raise LoweringError(f"the exported program's dynamic dims cannot be bucketed: {exc}") \
            from exc
    binding = {}
    for symbol, (placeholder, dim) in spec.binding.items():
        argument = graph_arguments[placeholder]
        if dim is None or argument["kind"] != "input":
            raise LoweringError(f"size {symbol} is not a dim of a user input")
        binding[symbol] = (user_names[argument["index"]], argument["index"], dim)
    records, keys = dynamic.plan_buckets(exported, spec, binding)
    tensor_arguments = [a for a, kind in zip(graph_arguments, spec.kinds) if kind == "tensor"]
    size_arguments = [{"kind": "size", "symbol": str(s)} for s in spec.symbols]
    programs = []
    for key in keys:
        pad_env = dict(zip(spec.symbols, key))
        try:
            plan = trace_bucket(gm, spec, pad_env)
        except NotPaddable as exc:
            raise LoweringError(f"the exported program cannot run padded to bucket "
                                f"{list(key)}: {exc}; export it with static shapes") from exc
        programs.append((f"bucket_{'x'.join(map(str, key))}", plan.gm,
                         tensor_arguments + size_arguments, list(key),
                         dynamic.dump_plan_outputs(plan.outputs, pad_env)))
    return records, programs


def _input_specs(user_names, flat_user, gm, graph_arguments) -> list:
    """The user inputs' specs; dims that are size symbols in the graph are marked dynamic."""
    import sympy
    inputs = [specs.tensor_spec(name, t) for name, t in zip(user_names, flat_user)]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, argument in zip(placeholders, graph_arguments):
        val = node.meta.get("val")
        if argument["kind"] != "input" or not isinstance(val, torch.Tensor):
            continue
        dynamic = {}
        for dim, size in enumerate(val.shape):
            expr = size.node.expr if isinstance(size, torch.SymInt) else None
            if isinstance(expr, sympy.Symbol):
                dynamic[str(dim)] = str(expr)
            elif expr is not None and not expr.is_number:
                raise LoweringError(f"input {user_names[argument['index']]!r} dim {dim} has "
                                    f"size {expr}; use a Dim of its own for it")
        if dynamic:
            inputs[argument["index"]]["dynamic"] = dynamic
    return inputs


def compile(model, example_args=(), example_kwargs=None, precision: str | None = None,
            keep_example_inputs: bool = True, dynamic_shapes=None) -> Artifact:
    """Export ``model`` (an nn.Module, function or ExportedProgram) and compile it ahead of time.

    The artifact holds portable StableHLO, the executable for this process's platform, the
    parameters, and the input/output specs. ``precision`` defaults to the one in force now.
    ``dynamic_shapes`` (torch.export's, with ``Dim``s that have a ``max``) makes dims dynamic:
    the artifact then holds one program per bucket of ``config.bucket_policy`` over each Dim's
    range, and the loader pads inputs to the bucket and cuts outputs back.

    Example::

        artifact = compile(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
        batch = torch.export.Dim("batch", min=2, max=32)
        bucketed = compile(torch.nn.Linear(4, 2), (torch.randn(3, 4),),
                           dynamic_shapes=({0: batch},))
    """
    from ..lower.precision import resolve_precision
    from ..runtime.client import get_client

    example_args, example_kwargs = _unaliased((tuple(example_args), dict(example_kwargs or {})))
    exported = _export(model, example_args, example_kwargs, dynamic_shapes)
    signature = exported.graph_signature
    for out in signature.output_specs:
        if out.kind != OutputKind.USER_OUTPUT:
            raise LoweringError(
                f"the exported program writes {out.target!r} in place ({out.kind.name}), and "
                f"an AOT artifact holds no state to update: export a forward that does not "
                f"(a program exported in training mode updates BatchNorm statistics: call "
                f"model.eval() before torch.export; a module's own in-place buffer writes "
                f"must go)")

    client = get_client()
    precision = precision or resolve_precision(client.platform)
    gm = exported.graph_module

    flat_user, in_spec = pytree.tree_flatten((example_args, example_kwargs))
    user_names = list(signature.user_inputs)
    if len(flat_user) != len(user_names) or not all(isinstance(t, torch.Tensor) for t in flat_user):
        others = [f"{_input_name(where)} ({type(value).__name__})" for where, value in
                  pytree.tree_flatten_with_path((example_args, example_kwargs))[0]
                  if not isinstance(value, torch.Tensor)]
        raise LoweringError(
            "AOT artifacts take tensor inputs only; not a tensor: " + ", ".join(others)
            + ". Fix such a value before exporting (functools.partial, or a setting of the "
            "model such as config.use_cache = False)")

    state_values = {**exported.state_dict, **exported.constants}
    graph_arguments, state = [], {}
    for spec in signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            graph_arguments.append({"kind": "input", "index": user_names.index(spec.arg.name)})
        else:
            state[spec.target] = state_values[spec.target].detach()
            graph_arguments.append({"kind": "state", "name": spec.target})
    inputs = _input_specs(user_names, flat_user, gm, graph_arguments)

    if any("dynamic" in spec for spec in inputs):
        dynamic_dims, plans = _dynamic_programs(exported, gm, graph_arguments, user_names)
    else:
        dynamic_dims, plans = [], [("static", gm, graph_arguments, None, None)]
    programs, portable, executables = [], {}, {}
    for name, program_gm, arguments, bucket, plan_outputs in plans:
        built = _build_program(name, program_gm, arguments, precision, client,
                               bucketed=bucket is not None)
        state.update(built.constants)
        programs.append({**built.entry, "bucket": bucket, "outputs": plan_outputs})
        portable[name], executables[name] = built.portable, built.executable

    out_spec = exported.call_spec.out_spec
    manifest = {
        "format": artifact_file.FORMAT,
        "format_version": artifact_file.FORMAT_VERSION,
        "inputs": inputs,
        "in_spec": specs.dump_treespec(in_spec),
        "out_spec": specs.dump_treespec(out_spec),
        "dynamic_dims": dynamic_dims,
        "programs": programs,
        "precision": precision,
        "stablehlo_version": _stablehlo_version(),
        "executables": {client.platform: specs.executable_tag(client)},
        "versions": specs.versions(),
    }
    if manifest["out_spec"] is None:
        manifest["out_type"] = type(pytree.tree_unflatten(
            [None] * out_spec.num_leaves, out_spec)).__name__
    example = {}
    if keep_example_inputs:
        example = {spec["name"]: t.detach() for spec, t in zip(manifest["inputs"], flat_user)}
    return Artifact(manifest=manifest, portable_stablehlo=portable,
                    executables={client.platform: executables},
                    state=state, example_inputs=example)


def _stablehlo_version() -> str:
    from jaxlib.mlir.dialects import stablehlo
    return stablehlo.get_current_version()
