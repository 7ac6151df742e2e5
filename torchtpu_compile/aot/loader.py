"""Loading an artifact: a PJRT load and nothing else (no Dynamo, no tracing, no torch-mlir).

Each program of the manifest becomes the one run path's ``Program`` (``program/run.py``): its
stored (or recompiled) executable with the calling convention the manifest records.
"""
from __future__ import annotations

import json

import torch
from torch.utils import _pytree as pytree

from .._logging import log
from . import artifact_file, specs
from .artifact_file import ArtifactError


class _Program:
    """One executable of an artifact with its calling convention (from the manifest); once
    ``bind`` gave it its state, ``program``: the ``Program`` that runs it."""

    def __init__(self, entry: dict, executable, symbols: dict):
        from ..output_slots import OutputSlot
        self.name = entry["name"]
        self.executable = executable
        self.bucket = entry.get("bucket")
        self.graph_arguments = entry["graph_arguments"]
        self.arg_indices = entry["arg_indices"]
        self.constants = entry["constants"]
        self.slots = [OutputSlot.from_json(slot) for slot in entry["output_slots"]]
        self.program = None
        self.plan_outputs = None
        if entry.get("outputs") is not None:  # a bucket: padded outputs, cut back per layout
            from .dynamic import load_layout, parse_expr
            self.plan_outputs = [
                (kind, rest[0], load_layout(rest[1], symbols)) if kind == "tensor" else
                (kind, parse_expr(rest[0], symbols)) if kind == "size" else (kind, rest[0])
                for kind, *rest in entry["outputs"]]

    def bind(self, state: dict) -> None:
        """Make ``program`` with the artifact's ``state`` (its types checked first: ``load``)."""
        from ..program.run import Program
        resident = frozenset(i for i, argument in enumerate(self.graph_arguments)
                             if argument["kind"] == "state")
        self.program = Program(self.executable, arg_indices=self.arg_indices, slots=self.slots,
                           constants=[state[name] for name in self.constants],
                           name=f"artifact program {self.name}", resident_inputs=resident)


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
        self._no_in_spec = None
        self._out_spec = self._spec(manifest["out_spec"])
        self._in_spec = self._input_spec(manifest.get("in_spec"))
        self._buckets = buckets  # a BucketTable, or None for static shapes
        self._by_bucket = {tuple(p.bucket): p for p in programs.values() if p.bucket is not None}

    def _spec(self, text):
        try:
            spec = specs.load_treespec(text, stand_ins=True)
        except NotImplementedError as exc:  # a class not imported here (transformers outputs)
            log.warning("torchtpu: %s: output structure not restored (%s); outputs come back as "
                        "a tuple. Import the module defining it before loading.", self.path, exc)
            return None
        except Exception as exc:
            raise ArtifactError(f"{self.path!r}: member 'manifest.json' is malformed: out_spec "
                                f"does not read back ({type(exc).__name__}: {exc})") from exc
        if spec is not None:
            for program in self.programs.values():
                count = len(program.plan_outputs) if program.plan_outputs is not None else \
                    sum(1 for slot in program.slots if slot.kind != "check")  # checks: no output
                if spec.num_leaves != count:
                    raise ArtifactError(
                        f"{self.path!r}: member 'manifest.json' is malformed: out_spec has "
                        f"{spec.num_leaves} outputs, program {program.name} {count}")
        return spec

    def _input_spec(self, text):
        """The ``(args, kwargs)`` structure recorded at export, or None (none recorded, or a
        class not importable here): inputs are then taken by position, and keywords refused."""
        if text is None:
            self._no_in_spec = ("the artifact does not record it: a class in the exported "
                                "inputs has no serialized name in torch.utils._pytree")
            return None
        try:
            return specs.load_treespec(text)
        except NotImplementedError as exc:  # a class not imported here
            log.warning("torchtpu: %s: input structure not restored (%s); inputs are matched "
                        "by position. Import the module defining it before loading.",
                        self.path, exc)
            self._no_in_spec = (f"it was not restored ({exc}); import the module defining it "
                                f"before loading")
            return None
        except Exception as exc:
            raise ArtifactError(f"{self.path!r}: member 'manifest.json' is malformed: in_spec "
                                f"does not read back ({type(exc).__name__}: {exc})") from exc

    def _flat_inputs(self, args: tuple, kwargs: dict) -> list:
        """The call's tensors in the recorded inputs' order: keywords and dict entries by
        name, as eager binds them, not by the order they were written in."""
        spec = self._in_spec
        if spec is None:
            if kwargs or _holds_a_dict(args):
                # by position, names in another order would bind to the wrong inputs
                raise TypeError(f"{self.path}: keyword arguments and dict inputs need the "
                                f"input structure, and {self._no_in_spec}; or pass inputs by "
                                f"position")
            return pytree.tree_leaves((args, kwargs))
        names = list(spec.child(1).context)
        if set(kwargs) != set(names):
            raise TypeError(f"{self.path}: got keyword arguments {sorted(kwargs)}; the artifact "
                            f"was exported with {names}")
        positional = spec.child(0).num_children
        if len(args) != positional:
            raise TypeError(f"{self.path}: expected {positional} inputs by position, got "
                            f"{len(args)}")
        flat, received = pytree.tree_flatten(_in_order((args, kwargs), spec))
        if received != spec:
            raise TypeError(f"{self.path}: the inputs are structured as {received}; the "
                            f"artifact was exported with {spec}")
        return flat

    def _check_inputs(self, flat: list) -> None:
        expected = self.manifest["inputs"]
        if len(flat) != len(expected):
            raise TypeError(f"{self.path}: expected {len(expected)} inputs "
                            f"({', '.join(s['name'] for s in expected)}), got {len(flat)}")
        for value, spec in zip(flat, expected):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{self.path}: input {spec['name']!r} must be a tensor, got "
                                f"{type(value).__name__}")
            if value.device.type == "meta":
                raise ValueError(f"{self.path}: input {spec['name']!r} is a meta tensor, which "
                                 f"has no values to run on")
            shape, dtype = list(value.shape), specs.dtype_name(value.dtype)
            dynamic = {int(d) for d in spec.get("dynamic", {})}
            static_ok = len(shape) == len(spec["shape"]) and all(
                d in dynamic or s == e for d, s, e in zip(range(len(shape)), shape, spec["shape"]))
            if not static_ok or dtype != spec["dtype"]:
                raise ValueError(
                    f"{self.path}: input {spec['name']!r} has shape {shape} and dtype {dtype}; "
                    f"the artifact was compiled for shape {self._shape_text(spec)} "
                    f"and dtype {spec['dtype']}")

    def _shape_text(self, spec: dict) -> str:
        """An input's exported shape with each dynamic dim as its range: ``[2, 2..64, 4]``."""
        dynamic = spec.get("dynamic", {})
        dims = []
        for d, size in enumerate(spec["shape"]):
            record = self._buckets.records[dynamic[str(d)]] if str(d) in dynamic else None
            dims.append(f"{record['min']}..{record['max']}" if record else str(size))
        return f"[{', '.join(dims)}]"

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
        return self._run(self._flat_inputs(args, kwargs))

    def _run(self, flat: list):
        """The outputs for ``flat``, the inputs in the recorded order."""
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
        # Results come back on the inputs' device: tpu tensors in, tpu tensors out.
        device = next((t.device.type for t in flat if t.device.type != "cpu"), "cpu")
        outputs = program.program(graph_args, device)
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
        return self._run([self.example_inputs[s["name"]] for s in self.manifest["inputs"]])


def _in_order(value, spec):
    """``value`` with every dict that has the keys of its place in ``spec`` rebuilt in
    ``spec``'s key order (pytree flattens a dict in its own order)."""
    if spec.is_leaf():
        return value
    children = spec.children()
    if spec.type is dict and isinstance(value, dict) and set(value) == set(spec.context):
        return {k: _in_order(value[k], c) for k, c in zip(spec.context, children)}
    if spec.type in (tuple, list) and type(value) is spec.type and len(value) == len(children):
        return spec.type(_in_order(v, c) for v, c in zip(value, children))
    return value


def _load_executable(path: str, members: dict, manifest: dict, entry: dict, client):
    """(executable, recompiled): the stored one where it was built for this platform and
    jaxlib, else compiled here from the program's portable StableHLO."""
    from jaxlib import _jax

    from ..runtime.executable import Executable, compile_stablehlo

    name = entry["name"]
    recorded = manifest["executables"].get(client.platform)
    if recorded is not None:
        # written before flags, then options, were recorded: compiled with neither
        recorded = {"xla_flags": "", "xla_options": "", **recorded}
    here = specs.executable_tag(client)
    blob = members.get(artifact_file.executable_member(client.platform, name))
    if recorded is not None and blob is not None and recorded == here:
        try:
            return Executable(client.pjrt.deserialize_executable(
                blob, client.device_list, _jax.CompileOptions()), key=entry["fingerprint"],
                serialized=blob, compiled_here=False), False
        except Exception as exc:
            log.warning("torchtpu: %s: stored executable %s did not load (%s)", path, name, exc)
    from jaxlib.mlir.dialects import stablehlo
    member = artifact_file.portable_member(name)
    built_for = ", ".join(_described(p, v) for p, v in manifest["executables"].items())
    log.warning("torchtpu: %s was compiled for %s; recompiling from its portable StableHLO "
                "for %s: program %s", path, built_for, _described(client.platform, here), name)
    with artifact_file.decoding(path, member):
        bytecode = stablehlo.deserialize_portable_artifact_str(members[member])
        if not bytecode:
            raise ValueError("not portable StableHLO")
    return compile_stablehlo(bytecode, entry["fingerprint"], manifest["precision"],
                             what=f"artifact {path} program {name}"), True


def _described(platform: str, tag: dict) -> str:
    flags = tag.get("xla_flags") or "none"
    options = tag.get("xla_options") or "none"
    return (f"{platform} ({tag['platform_version']}, jaxlib {tag['jaxlib']}, XLA flags: {flags}, "
            f"XLA options: {options})")


def _load_state(path: str, members: dict, name: str, aliases: dict, convert=None) -> dict:
    """The tensors of the safetensors member ``name`` (each passed through ``convert``), with
    ``aliases`` (alias -> stored name) added; ArtifactError naming the member where it does not
    read back."""
    from safetensors.torch import load as load_tensors

    with artifact_file.decoding(path, name):
        tensors = load_tensors(members[name])
    if convert is not None:
        tensors = {key: convert(t) for key, t in tensors.items()}
    for alias, stored in aliases.items():
        if stored not in tensors:
            raise ArtifactError(f"{path!r}: member 'manifest.json' is malformed: alias "
                                f"{alias!r} names {stored!r}, which {name} does not hold")
        tensors[alias] = tensors[stored]
    return tensors


def _check_examples(path: str, inputs: list, example: dict) -> None:
    """The saved example inputs are inputs the artifact takes (``run_example`` calls it)."""
    for spec in inputs:
        tensor = example.get(spec["name"])
        dynamic = {int(d) for d in spec.get("dynamic", {})}
        if tensor is None or specs.dtype_name(tensor.dtype) != spec["dtype"] or \
                tensor.dim() != len(spec["shape"]) or any(
                    d not in dynamic and size != want
                    for d, (size, want) in enumerate(zip(tensor.shape, spec["shape"]))):
            got = "nothing" if tensor is None else \
                f"{specs.dtype_name(tensor.dtype)}{list(tensor.shape)}"
            raise ArtifactError(f"{path!r}: member 'example_inputs.safetensors' holds {got} "
                                f"for input {spec['name']!r}, which is {spec['dtype']}"
                                f"{spec['shape']}")


def _parameter_types(executable) -> list | None:
    """[(dtype name, shape)] of the executable's parameters, or None where PJRT cannot say."""
    try:
        from jax._src.lib import xla_client
        module = executable.loaded.hlo_modules()[0]
        shape = xla_client.XlaComputation(module.as_serialized_hlo_module_proto()).program_shape()
        return [(p.element_type().name, tuple(p.dimensions())) for p in shape.parameter_shapes()]
    except Exception as exc:
        log.debug("torchtpu: parameter types of an artifact program unavailable: %s", exc)
        return None


def _check_parameter_types(path: str, manifest: dict, program: _Program, state: dict,
                           buckets) -> None:
    """Every buffer the program will be given has the dtype and shape its executable takes:
    an input spec or a tensor in params.safetensors that says otherwise, even with the same
    byte size, would have its bits read as another type. ArtifactError naming the member."""
    taken = _parameter_types(program.executable)
    if taken is None:
        log.warning("torchtpu: %s: the parameter types of program %s cannot be read from its "
                    "executable; input and weight dtypes are not checked against it", path,
                    program.name)
        return
    bucket = dict(zip((r["symbol"] for r in manifest["dynamic_dims"]), program.bucket or ()))
    given = []  # (what, member at fault, dtype name, shape)
    for i in program.arg_indices:
        argument = program.graph_arguments[i]
        if argument["kind"] == "input":
            spec = manifest["inputs"][argument["index"]]
            dynamic = spec.get("dynamic", {})
            shape = tuple(bucket[dynamic[str(d)]] if str(d) in dynamic else size
                          for d, size in enumerate(spec["shape"]))
            given.append((f"input {spec['name']!r}", "manifest.json", spec["dtype"], shape))
        elif argument["kind"] == "state":
            given.append(_state_type(path, argument["name"], state))
        else:
            given.append((f"size {argument['symbol']}", "manifest.json", "int64", ()))
    given += [_state_type(path, name, state) for name in program.constants]
    if len(given) != len(taken):
        raise ArtifactError(f"{path!r}: member 'manifest.json' is malformed: program "
                            f"{program.name} passes {len(given)} arguments to an executable "
                            f"taking {len(taken)}")
    for (what, member, dtype, shape), (want_dtype, want_shape) in zip(given, taken):
        if dtype != want_dtype or tuple(shape) != want_shape:
            raise ArtifactError(
                f"{path!r}: member {member!r} gives {what} as {dtype}{list(shape)}, but program "
                f"{program.name} takes {want_dtype}{list(want_shape)} there; the artifact was "
                f"modified or is inconsistent. Export it again.")


def _state_type(path: str, name: str, state: dict) -> tuple:
    if name not in state:
        raise ArtifactError(f"{path!r}: member 'params.safetensors' lacks {name!r}, which the "
                            f"manifest's programs take")
    tensor = state[name]
    return (f"tensor {name!r}", "params.safetensors", specs.dtype_name(tensor.dtype),
            tuple(tensor.shape))


def _holds_a_dict(value) -> bool:
    if isinstance(value, dict):
        return True
    return isinstance(value, (list, tuple)) and any(_holds_a_dict(v) for v in value)


def load(path: str) -> LoadedArtifact:
    """Load an artifact written by ``Artifact.save``; recompile only if it was built elsewhere.

    Every member is checked first (``artifact_file.read_members``: sizes, names, checksums;
    ``manifest.parse``: the manifest's fields), and what reads back from a member that is
    malformed all the same is an ``ArtifactError`` naming it, as is an input or weight whose
    dtype or shape is not the one the program's executable takes.

    Example::

        run = torchtpu_compile.aot.load("model.tpu")
        out = run(torch.randint(0, 100, (2, 8)))
    """
    from ..runtime.client import get_client
    from ..runtime.transfer import shareable
    from .dynamic import BucketTable

    members = artifact_file.read_members(path)
    manifest = json.loads(members["manifest.json"])  # checked by read_members
    # Tensors at arbitrary offsets of the file: copied where the CPU client could not share
    # them, as it must to keep them resident (runtime.transfer.to_buffer).
    state = _load_state(path, members, "params.safetensors", manifest.get("state_aliases", {}),
                        convert=shareable)
    example = {}
    if "example_inputs.safetensors" in members:
        example = _load_state(path, members, "example_inputs.safetensors", {})
    client = get_client()
    buckets = BucketTable(path, manifest["dynamic_dims"], manifest["inputs"])
    programs, recompiled = {}, False
    for entry in manifest["programs"]:
        executable, rebuilt = _load_executable(path, members, manifest, entry, client)
        recompiled |= rebuilt
        with artifact_file.decoding(path, "manifest.json"):
            program = _Program(entry, executable, buckets.symbols)
        _check_parameter_types(path, manifest, program, state, buckets)
        program.bind(state)
        programs[entry["name"]] = program
    if example:  # after the programs: an input spec at odds with them is the manifest's fault
        _check_examples(path, manifest["inputs"], example)
    return LoadedArtifact(path, manifest, programs, state, example, recompiled,
                          buckets if manifest["dynamic_dims"] else None)
