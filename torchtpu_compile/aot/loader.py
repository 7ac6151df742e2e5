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


class LoadedArtifact:
    """A callable over a loaded artifact; takes and returns tensors like the exported model."""

    def __init__(self, path: str, manifest: dict, executable, state: dict, example_inputs: dict,
                 recompiled: bool):
        self.path = path
        self.manifest = manifest
        self.executable = executable
        self.state = state
        self.example_inputs = example_inputs
        self.recompiled = recompiled
        self._out_spec = self._spec(manifest["out_spec"])

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
            if shape != spec["shape"] or dtype != spec["dtype"]:
                raise ValueError(
                    f"{self.path}: input {spec['name']!r} has shape {shape} and dtype {dtype}; "
                    f"the artifact was compiled for shape {spec['shape']} and dtype "
                    f"{spec['dtype']}")

    def __call__(self, *args, **kwargs):
        from ..runtime.transfer import to_buffer, wrapper_for

        flat = pytree.tree_leaves((args, kwargs))  # matched to the recorded inputs by position
        self._check_inputs(flat)
        buffers = []
        for argument in self.manifest["program_arguments"]:
            if argument["kind"] == "input":
                buffers.append(to_buffer(flat[argument["index"]]))
            else:
                buffers.append(to_buffer(self.state[argument["name"]], resident=True))
        # Results come back on the inputs' device: tpu tensors in, tpu tensors out.
        device = next((t.device.type for t in flat if t.device.type != "cpu"), "cpu")
        wrap = wrapper_for(device)
        results = [wrap(b) for b in self.executable.run(buffers)]
        outputs = []
        for slot in self.manifest["output_slots"]:
            if slot["kind"] == "program":
                outputs.append(results[slot["index"]])
            elif slot["kind"] == "user_input":
                outputs.append(flat[slot["index"]])
            elif slot["kind"] == "state":
                outputs.append(self.state[slot["name"]])
            elif slot["kind"] == "constant":
                outputs.append(slot["value"])
            else:
                outputs.append(None)
        if self._out_spec is None:
            return tuple(outputs)
        return pytree.tree_unflatten(outputs, self._out_spec)

    def run_example(self):
        """Run on the example inputs saved at export time."""
        if not self.example_inputs:
            raise ArtifactError(f"{self.path} was saved without example inputs")
        return self(*[self.example_inputs[s["name"]] for s in self.manifest["inputs"]])


def load(path: str) -> LoadedArtifact:
    """Load an artifact written by ``Artifact.save``; recompile only if it was built elsewhere.

    Example::

        run = torchtpu_compile.aot.load("model.tpu")
        out = run(torch.randint(0, 100, (2, 8)))
    """
    from jaxlib import _jax
    from safetensors.torch import load as load_tensors

    from ..runtime.client import get_client
    from ..runtime.executable import Executable, compile_stablehlo

    members = artifact_file.read_members(path)
    manifest = json.loads(members["manifest.json"])
    client = get_client()
    recorded = manifest["executables"].get(client.platform)
    blob = members.get(f"executables/{client.platform}.bin")
    loaded = None
    if recorded is not None and blob is not None and recorded == _platform_tag(client):
        try:
            loaded = Executable(client.pjrt.deserialize_executable(
                blob, client.device_list, _jax.CompileOptions()), key=manifest["fingerprint"],
                serialized=blob, compiled_here=False)
        except Exception as exc:
            log.warning("torchtpu: %s: stored executable did not load (%s)", path, exc)
    recompiled = loaded is None
    if recompiled:
        from jaxlib.mlir.dialects import stablehlo
        built_for = ", ".join(f"{p} ({v['platform_version']}, jaxlib {v['jaxlib']})"
                              for p, v in manifest["executables"].items())
        log.warning("torchtpu: %s was compiled for %s; recompiling from its portable StableHLO "
                    "for %s (%s)", path, built_for, client.platform,
                    _platform_tag(client)["platform_version"])
        bytecode = stablehlo.deserialize_portable_artifact_str(members["stablehlo.portable"])
        loaded = compile_stablehlo(bytecode, manifest["fingerprint"], manifest["precision"],
                                   what=f"artifact {path}")
    state = load_tensors(members["params.safetensors"])
    for alias, stored in manifest.get("state_aliases", {}).items():
        state[alias] = state[stored]
    example = {}
    if "example_inputs.safetensors" in members:
        example = load_tensors(members["example_inputs.safetensors"])
    return LoadedArtifact(path, manifest, loaded, state, example, recompiled)
