"""The shape of an artifact's ``manifest.json``, checked before anything reads it.

A manifest whose checksum is right can still be wrong (written by hand, by another tool, or by
a bug): every field the loader and the CLI read is checked here for its type and for the
cross-references between fields (a program's argument indices, the inputs and symbols they
name), so that a bad manifest is one ``ArtifactError`` naming the field, never a ``KeyError``
or an ``IndexError`` later, or a wrong answer.

Example::

    manifest = parse(path, members["manifest.json"])    # ArtifactError: manifest.json: ...
    expected_members(manifest)   # {"params.safetensors", "stablehlo/static.portable", ...}
"""
from __future__ import annotations

import json
import re

from . import specs
from .artifact_file import (FORMAT, READABLE_VERSIONS, ArtifactError, executable_member,
                            portable_member)

MEMBER = "manifest.json"
_PROGRAM_NAME = re.compile(r"[A-Za-z0-9_]+")


class _Invalid(ValueError):
    """One field of the manifest that is not what the format says (``where``: its path)."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")


# --- a small schema language: each schema is a function (value, where) -> None -------------

def _show(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _type(kind, name: str):
    def check(value, where):
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise _Invalid(where, f"expected {name}, got {_show(value)}")
    return check


string, boolean = _type(str, "a string"), _type(bool, "true or false")
integer = _type(int, "an integer")


def count(value, where):
    integer(value, where)
    if value < 0:
        raise _Invalid(where, f"expected a count (>= 0), got {value}")


def anything(value, where):
    pass


def nullable(schema):
    def check(value, where):
        if value is not None:
            schema(value, where)
    return check


def one_of(*choices):
    def check(value, where):
        if value not in choices:
            raise _Invalid(where, f"expected one of {', '.join(map(str, choices))}, got "
                                  f"{_show(value)}")
    return check


def list_of(item):
    def check(value, where):
        if not isinstance(value, list):
            raise _Invalid(where, f"expected a list, got {_show(value)}")
        for i, element in enumerate(value):
            item(element, f"{where}[{i}]")
    return check


def dict_of(item):
    def check(value, where):
        if not isinstance(value, dict):
            raise _Invalid(where, f"expected an object, got {_show(value)}")
        for key, element in value.items():
            item(element, f"{where}.{key}")
    return check


def record(required: dict, optional: dict | None = None):
    """An object with the ``required`` fields and maybe the ``optional`` ones (others are
    allowed: a newer torchtpu may add fields this one does not read)."""
    def check(value, where):
        if not isinstance(value, dict):
            raise _Invalid(where, f"expected an object, got {_show(value)}")
        for name, schema in required.items():
            if name not in value:
                raise _Invalid(where, f"missing field {name!r}")
            schema(value[name], f"{where}.{name}")
        for name, schema in (optional or {}).items():
            if name in value:
                schema(value[name], f"{where}.{name}")
    return check


# --- the manifest --------------------------------------------------------------------------

dtype = one_of(*specs.DTYPE_NAMES)
TENSOR = record({"name": string, "shape": list_of(count), "dtype": dtype})
INPUT = record({"name": string, "shape": list_of(count), "dtype": dtype},
               {"dynamic": dict_of(string)})
GRAPH_ARGUMENT = record({"kind": one_of("input", "state", "size")},
                        {"index": count, "name": string, "symbol": string})


def EMPTY_SPEC(value, where):  # noqa: N802  (a schema, like the constants around it)
    """An "empty" output slot's value: [shape, dtype name, device type]."""
    if not (isinstance(value, list) and len(value) == 3):
        raise _Invalid(where, f"expected [shape, dtype, device], got {_show(value)}")
    import torch
    list_of(count)(value[0], f"{where}[0]")
    if not isinstance(value[1], str) or not isinstance(getattr(torch, value[1], None),
                                                        torch.dtype):
        raise _Invalid(f"{where}[1]", f"not a torch dtype: {_show(value[1])}")
    string(value[2], f"{where}[2]")


def _check_view_slot(value, where):
    from ..output_slots import decode_view_steps
    if not isinstance(value, dict) or value.get("of") not in ("program", "input") or \
            not isinstance(value.get("ops"), list):
        raise _Invalid(where, f"expected {{'of': 'program' | 'input', 'ops': [...]}}, got "
                              f"{_show(value)}")
    try:
        decode_view_steps(value["ops"])
    except Exception as exc:
        raise _Invalid(f"{where}.ops", f"not view steps ({type(exc).__name__}: {exc})") from exc


def _check_memory_order(value, output: dict, where):
    """A "program" slot's value: {"memory_order": a permutation of its output's dims}."""
    order = value.get("memory_order") if isinstance(value, dict) else None
    if not isinstance(order, list) or sorted(order) != list(range(len(output["shape"]))):
        raise _Invalid(where, f"expected {{'memory_order': a permutation of "
                              f"{len(output['shape'])} dims}}, got {_show(value)}")


# size None: a bucket's dynamic dim, its size known at run time (lower/index_checks.py)
INDEX_CHECK = record({"op": string, "dim": integer, "size": nullable(integer)},
                     {"where": nullable(string), "entry": nullable(integer)})


OUTPUT_SLOT = record({"kind": one_of("program", "input", "none", "constant", "empty", "view",
                                     "check")},
                     {"index": integer, "value": anything})
PROGRAM = record({
    "name": string, "graph_arguments": list_of(GRAPH_ARGUMENT), "arg_indices": list_of(count),
    "constants": list_of(string), "output_slots": list_of(OUTPUT_SLOT),
    "program_outputs": list_of(TENSOR), "fingerprint": string,
    "stablehlo_op_counts": dict_of(count),
}, {"bucket": nullable(list_of(count)), "outputs": nullable(list_of(list_of(anything)))})
DYNAMIC_DIM = record({"input": string, "input_index": count, "dim": count, "symbol": string,
                      "min": count, "max": count, "buckets": list_of(count)})
MANIFEST = record({
    "format": one_of(FORMAT), "format_version": one_of(*READABLE_VERSIONS),
    "inputs": list_of(INPUT), "in_spec": nullable(string), "out_spec": nullable(string),
    "dynamic_dims": list_of(DYNAMIC_DIM), "programs": list_of(PROGRAM),
    "precision": one_of("medium", "high", "highest"), "stablehlo_version": string,
    # xla_flags, xla_options: absent from artifacts written before they were recorded (none)
    "executables": dict_of(record({"platform_version": string, "jaxlib": string},
                                  {"xla_flags": string, "xla_options": string})),
    "versions": dict_of(nullable(string)),
}, {"state_aliases": dict_of(string), "out_type": string})


def _check_references(manifest: dict) -> None:
    """What the types alone do not say: indices in range, names that exist."""
    inputs, dims = manifest["inputs"], manifest["dynamic_dims"]
    symbols = {d["symbol"] for d in dims}
    for i, spec in enumerate(inputs):
        for dim, symbol in spec.get("dynamic", {}).items():
            if not dim.isdigit() or int(dim) >= len(spec["shape"]) or symbol not in symbols:
                raise _Invalid(f"inputs[{i}].dynamic.{dim}", f"no dim {dim} of symbol "
                                                             f"{symbol!r} in this input")
    for i, record_ in enumerate(dims):
        where = f"dynamic_dims[{i}]"
        if record_["input_index"] >= len(inputs) or \
                record_["dim"] >= len(inputs[record_["input_index"]]["shape"]):
            raise _Invalid(where, "names a dim of no input")
        if not record_["buckets"] or record_["buckets"] != sorted(record_["buckets"]) or \
                record_["buckets"][-1] < record_["max"]:
            raise _Invalid(f"{where}.buckets", "must rise to the dim's max")
    programs = manifest["programs"]
    if not programs:
        raise _Invalid("programs", "no program")
    names = [p["name"] for p in programs]
    if len(set(names)) != len(names):
        raise _Invalid("programs", "two programs with one name")
    if not dims and names != ["static"]:
        raise _Invalid("programs", "a static artifact has one program, 'static'")
    for i, program in enumerate(programs):
        _check_program(program, f"programs[{i}]", len(inputs), symbols, len(dims))


def _check_program(program: dict, where: str, n_inputs: int, symbols: set, n_dims: int):
    if not _PROGRAM_NAME.fullmatch(program["name"]):
        raise _Invalid(f"{where}.name", f"not a program name: {_show(program['name'])}")
    arguments = program["graph_arguments"]
    for j, argument in enumerate(arguments):
        kind, at = argument["kind"], f"{where}.graph_arguments[{j}]"
        field = {"input": "index", "state": "name", "size": "symbol"}[kind]
        if field not in argument:
            raise _Invalid(at, f"a {kind} argument needs {field!r}")
        if kind == "input" and argument["index"] >= n_inputs:
            raise _Invalid(f"{at}.index", f"input {argument['index']} of {n_inputs}")
        if kind == "size" and argument["symbol"] not in symbols:
            raise _Invalid(f"{at}.symbol", f"no dynamic dim {argument['symbol']!r}")
    for j, index in enumerate(program["arg_indices"]):
        if index >= len(arguments):
            raise _Invalid(f"{where}.arg_indices[{j}]",
                           f"argument {index} of {len(arguments)}")
    bound = {"program": len(program["program_outputs"]), "input": len(arguments)}
    for j, slot in enumerate(program["output_slots"]):
        at = f"{where}.output_slots[{j}]"
        if slot["kind"] == "view":
            _check_view_slot(slot.get("value"), f"{at}.value")
        if slot["kind"] == "check":
            list_of(INDEX_CHECK)(slot.get("value"), f"{at}.value")
        base = slot["value"]["of"] if slot["kind"] == "view" else slot["kind"]
        limit = bound.get("program" if base == "check" else base)
        if limit is not None and not 0 <= slot.get("index", -1) < limit:
            raise _Invalid(f"{at}.index", f"{slot['kind']} {slot.get('index')} of {limit}")
        if slot["kind"] == "program" and slot.get("value") is not None:
            _check_memory_order(slot["value"], program["program_outputs"][slot["index"]],
                                f"{at}.value")
        if slot["kind"] == "empty":
            EMPTY_SPEC(slot.get("value"), f"{at}.value")
        if slot["kind"] == "constant" and not isinstance(slot.get("value"),
                                                         (int, float, bool, type(None))):
            raise _Invalid(f"{at}.value", f"not a number: {_show(slot.get('value'))}")
    bucket = program.get("bucket")
    if (bucket is None) != (n_dims == 0) or bucket is not None and len(bucket) != n_dims:
        raise _Invalid(f"{where}.bucket", f"expected {n_dims} bucket sizes, got "
                                          f"{_show(bucket)}")
    if (program.get("outputs") is None) != (n_dims == 0):
        raise _Invalid(f"{where}.outputs", "a bucket program maps its outputs back, only it")


def parse(path: str, data: bytes) -> dict:
    """The manifest in ``data``, checked; ArtifactError naming manifest.json and the field.

    Example::

        manifest = parse("model.tpu", b'{"format": "torchtpu-aot", ...}')
    """
    try:
        manifest = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        raise ArtifactError(f"{path!r}: {MEMBER} is not JSON ({exc})") from exc
    if isinstance(manifest, dict) and manifest.get("format") != FORMAT:
        raise ArtifactError(f"{path!r} is not a torchtpu artifact")
    if isinstance(manifest, dict) and manifest.get("format_version") not in READABLE_VERSIONS:
        raise ArtifactError(f"{path!r} has format version {manifest.get('format_version')}; "
                            f"this torchtpu reads versions "
                            f"{', '.join(map(str, READABLE_VERSIONS))}")
    try:
        MANIFEST(manifest, "manifest")
        _check_references(manifest)
    except _Invalid as exc:
        raise ArtifactError(f"{path!r}: {MEMBER} is malformed: {exc}") from None
    return manifest


def expected_members(manifest: dict) -> set:
    """Every member an artifact with this manifest may hold (besides the manifest and the
    checksum table)."""
    names = {"params.safetensors", "example_inputs.safetensors"}
    for program in manifest["programs"]:
        names.add(portable_member(program["name"]))
        for platform in manifest["executables"]:
            names.add(executable_member(platform, program["name"]))
    return names
