"""Loading an artifact: a PJRT load and nothing else (no Dynamo, no tracing, no torch-mlir)."""
from __future__ import annotations

import json

import torch
from torch.utils import _pytree as pytree

from .._logging import log
from . import artifact_file, specs
from .artifact_file import ArtifactError


def _platform_tag(client) -> dict:
    """What an executable built here depends on: compared with the artifact's record."""
    import jaxlib
    return {"platform_version": client.pjrt.platform_version, "jaxlib": jaxlib.__version__}


class _Program:
    """One executable of an artifact with its calling convention (from the manifest)."""

    def __init__(self, entry: dict, executable, symbols: dict):
        from ..output_slots import OutputSlot, check_index
        self.name = entry["name"]
        self.executable = executable
        self.bucket = entry.get("bucket")
        self.graph_arguments = entry["graph_arguments"]
        self.arg_indices = entry["arg_indices"]
        self.constants = entry["constants"]
        self.slots = [OutputSlot.from_json(slot) for slot in entry["output_slots"]]
        self.check = check_index(self.slots)
        self.plan_outputs = None
        if entry.get("outputs") is not None:  # a bucket: padded outputs, cut back per layout
            from .dynamic import load_layout, parse_expr
            self.plan_outputs = [
                (kind, rest[0], load_layout(rest[1], symbols)) if kind == "tensor" else
                (kind, parse_expr(rest[0], symbols)) if kind == "size" else (kind, rest[0])
                for kind, *rest in entry["outputs"]]


class LoadedArtifact:
    """A callable over a loaded artifact; takes and returns tensors like the exported model."""

    def __init__(self, path: str, manifest: dict, programs: dict, state: dict,
                 example_inputs: dict, recompiled: bool, buckets):
        self.path = path
        self.manifest = manifest
        self.programs = programs  # name -> _Program
        self.state = state
        self.example_inputs = example_inputs
        self.recompiled = recompiled
        self._out_spec = self._spec(manifest["out_spec"])
        self._buckets = buckets  # a BucketTable, or None for static shapes
        self._by_bucket = {tuple(p.bucket): p for p in programs.values() if p.bucket is not None}

    def _spec(self, text):
        try:
            return specs.load_treespec(text)
        except Exception as exc:  # e.g. a transformers output class not imported here
            log.warning("torchtpu: %s: output structure not restored (%s); outputs come back as "
                        "a tuple. Import the module defining it before loading.", self.path, exc)
            return None

    def _check_inputs(self, flat: list) -> None:
        expected = self.manifest["inputs"]
        if len(flat) != len(expected):
            raise TypeError(f"{self.path}: expected {len(expected)} inputs "
                            f"({', '.join(s['name'] for s in expected)}), got {len(flat)}")
        for value, spec in zip(flat, expected):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{self.path}: input {spec['name']!r} must be a tensor, got "
                                f"{type(value).__name__}")
            shape, dtype = list(value.shape), specs.dtype_name(value.dtype)
            dynamic = {int(d) for d in spec.get("dynamic", {})}
            static_ok = len(shape) == len(spec["shape"]) and all(
                d in dynamic or s == e for d, s, e in zip(range(len(shape)), shape, spec["shape"]))
            if not static_ok or dtype != spec["dtype"]:
                wanted = [f"<{spec['dynamic'][str(d)]}>" if d in dynamic else e
                          for d, e in enumerate(spec["shape"])]
                raise ValueError(
                    f"{self.path}: input {spec['name']!r} has shape {shape} and dtype {dtype}; "
                    f"the artifact was compiled for shape {wanted if dynamic else spec['shape']} "
                    f"and dtype {spec['dtype']}")

    def _choose(self, flat: list):
        """(program, real sizes, padded sizes, inputs padded to the program's bucket)."""
        if self._buckets is None:
            return self.programs["static"], None, None, flat
        from ..buckets.layout import pad, prefix
        real_env = self._buckets.bind(flat)
        key = self._buckets.key(real_env)
        pad_env = self._buckets.pad_env(key)
        padded = []
        for value, spec in zip(flat, self.manifest["inputs"]):
            dynamic = spec.get("dynamic", {})
            layout = tuple(prefix(self._buckets.symbols[dynamic[str(d)]])
                           if str(d) in dynamic else None for d in range(value.dim()))
            padded.append(pad(value, layout, real_env, pad_env))
        return self._by_bucket[key], real_env, pad_env, padded

    def __call__(self, *args, **kwargs):
        from ..output_slots import collect_outputs
        from ..runtime.transfer import to_buffer, wrapper_for

        flat = pytree.tree_leaves((args, kwargs))  # matched to the recorded inputs by position
        self._check_inputs(flat)
        program, real_env, pad_env, inputs = self._choose(flat)
        graph_args = []
        for argument in program.graph_arguments:
            kind = argument["kind"]
            if kind == "input":
                graph_args.append(inputs[argument["index"]])
            elif kind == "state":
                graph_args.append(self.state[argument["name"]])
            else:  # a size symbol's real value, as the bucket's program takes it
                symbol = self._buckets.symbols[argument["symbol"]]
                graph_args.append(torch.tensor(real_env[symbol], dtype=torch.int64))
        buffers = [to_buffer(graph_args[i], resident=program.graph_arguments[i]["kind"] == "state")
                   for i in program.arg_indices]
        buffers += [to_buffer(self.state[name], resident=True) for name in program.constants]
        # Results come back on the inputs' device: tpu tensors in, tpu tensors out.
        device = next((t.device.type for t in flat if t.device.type != "cpu"), "cpu")
        wrap = wrapper_for(device)
        # The index checks' output stays a buffer: collect_outputs reads it (index_errors.py).
        results = [b if i == program.check else wrap(b)
                   for i, b in enumerate(program.executable.run(buffers))]
        outputs = collect_outputs(program.slots, results, graph_args, device,
                                  defer_checks=device != "cpu")
        if program.plan_outputs is not None:
            from ..buckets.layout import unpad_outputs
            outputs = unpad_outputs(outputs, program.plan_outputs, real_env, pad_env)
        if self._out_spec is None:
            return tuple(outputs)
        return pytree.tree_unflatten(outputs, self._out_spec)

    def run_example(self):
        """Run on the example inputs saved at export time."""
        if not self.example_inputs:
            raise ArtifactError(f"{self.path} was saved without example inputs")
        return self(*[self.example_inputs[s["name"]] for s in self.manifest["inputs"]])


def _load_executable(path: str, members: dict, manifest: dict, entry: dict, client):
    """(executable, recompiled): the stored one where it was built for this platform and
    jaxlib, else compiled here from the program's portable StableHLO."""
    from jaxlib import _jax

    from ..runtime.executable import Executable, compile_stablehlo

    name = entry["name"]
    recorded = manifest["executables"].get(client.platform)
    blob = members.get(artifact_file.executable_member(client.platform, name))
    if recorded is not None and blob is not None and recorded == _platform_tag(client):
        try:
            return Executable(client.pjrt.deserialize_executable(
                blob, client.device_list, _jax.CompileOptions()), key=entry["fingerprint"],
                serialized=blob, compiled_here=False), False
        except Exception as exc:
            log.warning("torchtpu: %s: stored executable %s did not load (%s)", path, name, exc)
    from jaxlib.mlir.dialects import stablehlo
    built_for = ", ".join(f"{p} ({v['platform_version']}, jaxlib {v['jaxlib']})"
                          for p, v in manifest["executables"].items())
    log.warning("torchtpu: %s was compiled for %s; recompiling from its portable StableHLO "
                "for %s (%s): program %s", path, built_for, client.platform,
                _platform_tag(client)["platform_version"], name)
    bytecode = stablehlo.deserialize_portable_artifact_str(
        members[artifact_file.portable_member(name)])
    return compile_stablehlo(bytecode, entry["fingerprint"], manifest["precision"],
                             what=f"artifact {path} program {name}"), True


def load(path: str) -> LoadedArtifact:
    """Load an artifact written by ``Artifact.save``; recompile only if it was built elsewhere.

    Example::

        run = torchtpu_compile.aot.load("model.tpu")
        out = run(torch.randint(0, 100, (2, 8)))
    """
    from safetensors.torch import load as load_tensors

    from ..runtime.client import get_client
    from .dynamic import BucketTable

    members = artifact_file.read_members(path)
    manifest = json.loads(members["manifest.json"])
    client = get_client()
    buckets = BucketTable(path, manifest["dynamic_dims"], manifest["inputs"])
    programs, recompiled = {}, False
    for entry in manifest["programs"]:
        executable, rebuilt = _load_executable(path, members, manifest, entry, client)
        recompiled |= rebuilt
        programs[entry["name"]] = _Program(entry, executable, buckets.symbols)
    state = load_tensors(members["params.safetensors"])
    for alias, stored in manifest.get("state_aliases", {}).items():
        state[alias] = state[stored]
    example = {}
    if "example_inputs.safetensors" in members:
        example = load_tensors(members["example_inputs.safetensors"])
    return LoadedArtifact(path, manifest, programs, state, example, recompiled,
                          buckets if manifest["dynamic_dims"] else None)
