"""Fault injection: one row per fault put into a cache or an AOT artifact, and what must follow.

A row names the case, the function that injects the fault and the expected outcome; the next
fault found is one more row. Rows whose ``note`` says "already correct" document behaviour that
was right before these tests were written; every other row failed on the code before its fix.

Cache rows run a small workload (a compiled function, an eager tpu op, or the Dynamo-level cache)
over a cache directory of their own, usually warmed first, then with the fault in place, and
expect the eager PyTorch result with at most one torchtpu warning and the counters as listed.
Artifact rows damage a saved artifact and expect ``ArtifactError`` naming the member at fault,
and the CLI to exit 2; or, for an artifact that is not damaged, a correct run.
"""
from __future__ import annotations

import builtins
import dataclasses
import hashlib
import json
import logging
import os
import pickle
import re
import shutil
import struct
import tempfile
import zipfile
from collections.abc import Callable

import pytest
import torch

from tests.support import aot_factories
import torchtpu_compile
import torchtpu_compile.aot as aot
import torchtpu_eager  # noqa: F401  (registers the tpu device)
from torchtpu_compile import config, dynamo_cache, graph_cache
from torchtpu_compile.aot.__main__ import main as aot_cli
from torchtpu_compile.backend import torchtpu_backend
from torchtpu_compile.lower import cache as lowering_cache
from torchtpu_compile.runtime import executable
from torchtpu_compile.runtime.cache import GRAPH_FOLDER, stores

# --- the world a cache row runs in ---------------------------------------------------------


def forget_this_process() -> None:
    """Level 1 of every cache, Dynamo's own cache and the counters: as a new process has them."""
    torch._dynamo.reset()
    executable.clear_cache()
    graph_cache.clear_memory()
    lowering_cache.clear_memory()
    dynamo_cache.clear_memory()
    torchtpu_compile.reset_stats()


@dataclasses.dataclass
class World:
    """One row's cache directories and monkeypatch; ``fired`` counts injected faults hit."""

    root: str
    monkeypatch: pytest.MonkeyPatch
    fired: int = 0

    @property
    def cache_dir(self) -> str:
        return torchtpu_compile.config.cache_dir

    def use_cache(self, name: str) -> str:
        path = os.path.join(self.root, name)
        torchtpu_compile.config.cache_dir = path
        return path

    def fire(self) -> None:
        self.fired += 1


@pytest.fixture
def world(tmp_path, monkeypatch):
    root = tmp_path / "world"
    root.mkdir(mode=0o700)
    # Rows set these further (a key, a remote, another disk): the patch puts all of them back.
    with config.patch(
            cache_dir=str(root / "cache"), cache_key=None, remote_cache=None, graph_cache=True,
            dynamo_cache=False, matmul_precision="highest"):  # results comparable with eager's
        monkeypatch.delenv("TORCHTPU_CACHE_KEY", raising=False)
        w = World(str(root), monkeypatch)
        forget_this_process()
        yield w
        monkeypatch.undo()  # faults off before the caches are touched again
    forget_this_process()


# --- workloads: each returns (result, eager reference) --------------------------------------

X = torch.linspace(-2, 2, 24).reshape(4, 6)


def compiled_fn(world: World):
    f = lambda x: torch.tanh(x @ x.T) * 3 + 1  # noqa: E731
    torch._dynamo.reset()
    return torch.compile(f, backend="torchtpu", dynamic=False)(X), f(X)


def other_fn(x):
    """Same signature and shapes as ``compiled_fn``'s function, another result: a plant."""
    return torch.sigmoid(x @ x.T) * 5 - 1


def eager_op(world: World):
    # A shape no other test uses: the eager device keeps programs per op and shape in this
    # process, and the fault must be met by a compile, not skipped by that cache.
    y = torch.linspace(-1, 1, 29)
    return (y.to("tpu").mul(2.5).sin()).cpu(), y.mul(2.5).sin()


def dynamo_frame(world: World):
    torchtpu_compile.config.dynamo_cache = True
    # The backend installs it at import only if the cache was on then.
    dynamo_cache.install(torchtpu_backend)
    return compiled_fn(world)


def warm(world: World, workload=compiled_fn) -> None:
    """Run ``workload`` once into the row's cache, then forget everything level 1 holds."""
    workload(world)
    stores.flush_writes()
    forget_this_process()


# --- reading and writing cache entries as a foreign process would ---------------------------

def read_frame(blob: bytes):
    """(magic, header dict, payload, trailer) of a framed entry, for any frame version."""
    magic = blob[:7]
    (length,) = struct.unpack_from("<I", blob, 7)
    header = json.loads(blob[11:11 + length])
    rest = blob[11 + length:]
    return magic, header, rest[:header["size"]], rest[header["size"]:]


def reframe(path: str, payload: bytes) -> None:
    """Replace the payload of the entry at ``path``, with a checksum that matches it: a frame
    that checks out around contents that do not decode."""
    magic, header, _, _ = read_frame(open(path, "rb").read())
    header.update(size=len(payload), sha256=hashlib.sha256(payload).hexdigest())
    header.pop("signed", None)
    head = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(magic + struct.pack("<I", len(head)) + head + payload)


def entry_files(directory: str) -> list[str]:
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".xla"))


def graph_entry(world: World, what: str) -> str:
    """The path of the one ``what`` ("lowering", "aot_autograd", "dynamo") entry in graphs/."""
    found = [p for p in entry_files(os.path.join(world.cache_dir, GRAPH_FOLDER))
             if read_frame(open(p, "rb").read())[1].get("what") == what]
    assert len(found) == 1, found
    return found[0]


def executable_entries(world: World) -> list[str]:
    return entry_files(world.cache_dir)


# --- faults in caches ----------------------------------------------------------------------

def unwritable_home(world: World) -> None:
    """The default ``~/.cache/torchtpu`` under a HOME nobody may write to (as a read-only HOME
    is, even for root): creating it fails with PermissionError."""
    home = os.path.join(world.root, "readonly-home")
    os.makedirs(home)
    world.monkeypatch.setenv("HOME", home)
    torchtpu_compile.config.cache_dir = os.path.join(home, ".cache", "torchtpu")
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        if os.path.abspath(path).startswith(home + os.sep):
            world.fire()
            raise PermissionError(13, "Permission denied", path)
        return real_mkdir(path, *args, **kwargs)
    world.monkeypatch.setattr(os, "mkdir", mkdir)


def deny_reads(world: World) -> None:
    """Entries that exist but cannot be read (another user's, mode 000): open() fails with
    PermissionError, as it would for anyone but root."""
    warm(world)
    real_open = builtins.open
    cache = world.cache_dir + os.sep

    def open_(file, mode="r", *args, **kwargs):
        if isinstance(file, str) and file.startswith(cache) and file.endswith(".xla") \
                and "r" in mode:
            world.fire()
            raise PermissionError(13, "Permission denied", file)
        return real_open(file, mode, *args, **kwargs)
    world.monkeypatch.setattr(builtins, "open", open_)


def directories_for_entries(world: World) -> None:
    """Every entry replaced by a directory of the same name: reads (and writes) fail with
    IsADirectoryError."""
    warm(world)
    for path in executable_entries(world) + entry_files(os.path.join(world.cache_dir,
                                                                     GRAPH_FOLDER)):
        os.unlink(path)
        os.mkdir(path)
        world.fire()


def remote_hit_unwritable_disk(world: World) -> None:
    """Entries on a remote, a new machine's disk cache that refuses writes: the remote hit must
    not fail copying the entry down."""
    remote = os.path.join(world.root, "remote")
    torchtpu_compile.config.remote_cache = f"file://{remote}"
    warm(world)
    disk = world.use_cache("new-machine-disk")
    real_mkstemp = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and os.path.abspath(dir).startswith(disk):
            world.fire()
            raise PermissionError(13, "Permission denied", dir)
        return real_mkstemp(*args, dir=dir, **kwargs)
    world.monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def damaged_payload(what: str, payload: bytes, workload=compiled_fn):
    """A ``what`` entry whose frame checks out but whose payload does not decode."""
    def inject(world: World) -> None:
        warm(world, workload)
        reframe(graph_entry(world, what), payload)
        world.fire()
    return inject


def damaged_aot_graph(world: World) -> None:
    """An aot_autograd entry that unpickles, but whose graph inside it does not: torch meets
    the damage while loading it (``RunnerOutputCode.post_compile``), not us."""
    warm(world)
    path = graph_entry(world, "aot_autograd")
    entry = pickle.loads(read_frame(open(path, "rb").read())[2])
    entry.compiled_fw.result._state = b"\x80\x05not a pickle"
    reframe(path, pickle.dumps(entry))
    world.fire()


def older_format(world: World) -> None:
    """Every entry as the torchtpu before the key-bound, signable frame wrote it (TTPUX1)."""
    warm(world)
    for path in executable_entries(world) + entry_files(os.path.join(world.cache_dir,
                                                                     GRAPH_FOLDER)):
        _, header, payload, _ = read_frame(open(path, "rb").read())
        head = json.dumps({k: v for k, v in header.items() if k not in ("key", "signed")})
        with open(path, "wb") as f:
            f.write(b"TTPUX1\n" + struct.pack("<I", len(head)) + head.encode() + payload)
        world.fire()


def damaged_executable(world: World) -> None:
    warm(world)
    for path in executable_entries(world):
        reframe(path, b"not a serialized executable")
        world.fire()


def damaged_dynamo_guards(world: World) -> None:
    """A Dynamo entry that unpickles, but whose guards inside it do not."""
    warm(world, dynamo_frame)
    path = graph_entry(world, "dynamo")
    entries = pickle.loads(read_frame(open(path, "rb").read())[2])
    for entry in entries:
        entry.guards_state = b"\x80\x05not a pickle"
    reframe(path, pickle.dumps(entries))
    world.fire()


def plant_other_lowering(world: World) -> str:
    """Someone who can write the cache folder fills it as a run of ``compiled_fn`` would, but
    with the lowering of another function under ``compiled_fn``'s key: the StableHLO of
    ``other_fn`` where ``compiled_fn``'s belongs. Returns the folder (not used yet)."""
    world.use_cache("plant-source")
    torch._dynamo.reset()
    torch.compile(other_fn, backend="torchtpu", dynamic=False)(X)
    planted = read_frame(open(graph_entry(world, "lowering"), "rb").read())[2]
    world.use_cache("attacker")
    warm(world)
    for path in executable_entries(world):  # so that the planted StableHLO is compiled
        os.unlink(path)
    reframe(graph_entry(world, "lowering"), planted)
    target = os.path.join(world.root, "cache")
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(world.cache_dir, target)
    world.use_cache("cache")
    world.fire()
    return target


def world_writable(world: World) -> None:
    os.chmod(plant_other_lowering(world), 0o777)


def owned_by_another_user(world: World) -> None:
    folder = plant_other_lowering(world)
    if os.geteuid() == 0:
        os.chown(folder, 65534, 65534)
    else:  # we cannot give a folder away: become someone else instead
        me = os.geteuid()
        world.monkeypatch.setattr(os, "geteuid", lambda: me + 1)


def keyed_remote(plant_unsigned: bool) -> Callable:
    """A remote shared by a team (world-writable) with ``TORCHTPU_CACHE_KEY`` set; with
    ``plant_unsigned``, someone without the key wrote every entry there."""
    def inject(world: World) -> None:
        remote = os.path.join(world.root, "remote")
        os.makedirs(remote)
        os.chmod(remote, 0o777)
        torchtpu_compile.config.cache_key = "team secret"
        torchtpu_compile.config.remote_cache = f"file://{remote}"
        warm(world)
        if plant_unsigned:
            for path in entry_files(remote) + entry_files(os.path.join(remote, GRAPH_FOLDER)):
                magic, header, payload, _ = read_frame(open(path, "rb").read())
                reframe(path, payload)  # the same content, without the signature
                world.fire()
        world.use_cache("new-machine-disk")
        world.fire()
    return inject


def swapped_signed_entries(world: World) -> None:
    """With a key, a signed lowering entry of another function copied under this function's
    name: its signature is valid, for another key."""
    torchtpu_compile.config.cache_key = "team secret"
    world.use_cache("plant-source")
    torch._dynamo.reset()
    torch.compile(other_fn, backend="torchtpu", dynamic=False)(X)
    planted = open(graph_entry(world, "lowering"), "rb").read()
    world.use_cache("cache")
    forget_this_process()
    warm(world)
    for path in executable_entries(world):
        os.unlink(path)
    with open(graph_entry(world, "lowering"), "wb") as f:
        f.write(planted)
    world.fire()


# --- what a cache row expects --------------------------------------------------------------

def count(cache: str, counter: str):
    """A counter of ``stats()["caches"]``: ``cache`` is a cache ("lowering", "aot_autograd",
    "dynamo", "executable": all its levels together) or one level of one ("executable/disk")."""
    name, _, level = cache.partition("/")
    return torchtpu_compile.stats()["caches"][name][level or "all"][counter]


@dataclasses.dataclass(frozen=True)
class Recovers:
    """Nothing raised, the eager result, exactly one torchtpu warning matching ``warning`` (or
    none at all when None), and ``counted``: {(cache, counter): value} after the run."""

    warning: str | None
    counted: dict = dataclasses.field(default_factory=dict)

    def check(self, world: World, workload, caplog) -> None:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="torchtpu"):
            result, reference = workload(world)
        torch.testing.assert_close(result, reference, rtol=1e-5, atol=1e-5)
        warnings = [r.getMessage() for r in caplog.records
                    if r.name == "torchtpu" and r.levelno >= logging.WARNING]
        if self.warning is None:
            assert warnings == []
        else:
            assert len(warnings) == 1, warnings
            assert re.search(self.warning, warnings[0]), warnings[0]
        for (cache, counter), value in self.counted.items():
            assert count(cache, counter) == value, (cache, counter, torchtpu_compile.stats())


@dataclasses.dataclass(frozen=True)
class CacheRow:
    """``case`` (the test id), the fault ``inject`` puts in place, what to ``expect`` when
    ``workload`` runs then, and a ``note`` marking rows that document behaviour that was
    already correct (those pass on the code before the fixes; every other row failed there)."""

    case: str
    inject: Callable[[World], None]
    expect: Recovers
    workload: Callable = compiled_fn
    note: str = ""


CORRUPT_ONCE = "(?i)discarding (corrupt|unreadable)"
CACHE_ROWS = [
    # Item 10: a cache we cannot use never stops work.
    CacheRow("default cache dir cannot be created, compile", unwritable_home,
             Recovers(r"cannot be used.*Permission denied")),
    CacheRow("default cache dir cannot be created, eager op", unwritable_home,
             Recovers(r"cannot be used.*Permission denied"), workload=eager_op),
    CacheRow("entries unreadable (PermissionError)", deny_reads,
             Recovers(r"Permission denied", {("executable/disk", "hits"): 0,
                                             ("lowering", "hits"): 0})),
    CacheRow("entries replaced by directories", directories_for_entries,
             Recovers(r"Is a directory", {("executable/disk", "hits"): 0})),
    CacheRow("remote hit, disk not writable", remote_hit_unwritable_disk,
             Recovers(r"Permission denied", {("executable/remote", "hits"): 1,
                                             ("executable/disk", "hits"): 0,
                                             ("lowering", "hits"): 1})),
    # Item 11: a payload that does not decode, inside a frame that checks out.
    CacheRow("lowering entry header not JSON",
             damaged_payload("lowering", (5).to_bytes(4, "little") + b"{nope" + b"ML\xefR"),
             Recovers(CORRUPT_ONCE, {("lowering", "corrupt"): 1, ("lowering", "misses"): 1,
                                     ("lowering", "hits"): 0})),
    CacheRow("lowering entry header not UTF-8",
             damaged_payload("lowering", (4).to_bytes(4, "little") + b"\xff\xfe\xfd\xfc"),
             Recovers(CORRUPT_ONCE, {("lowering", "corrupt"): 1, ("lowering", "misses"): 1,
                                     ("lowering", "hits"): 0})),
    CacheRow("lowering entry header of another shape",
             damaged_payload("lowering", (2).to_bytes(4, "little") + b"[]" + b"ML\xefR"),
             Recovers(CORRUPT_ONCE, {("lowering", "corrupt"): 1, ("lowering", "hits"): 0})),
    CacheRow("aot_autograd entry not a pickle",
             damaged_payload("aot_autograd", b"\x80\x05garbage"),
             Recovers(CORRUPT_ONCE, {("aot_autograd", "corrupt"): 1,
                                     ("aot_autograd", "misses"): 1,
                                     ("aot_autograd", "hits"): 0})),
    CacheRow("aot_autograd entry a pickle of something else",
             damaged_payload("aot_autograd", pickle.dumps({"not": "an entry"})),
             Recovers(CORRUPT_ONCE, {("aot_autograd", "corrupt"): 1,
                                     ("aot_autograd", "misses"): 1,
                                     ("aot_autograd", "hits"): 0})),
    CacheRow("aot_autograd entry whose graph does not unpickle", damaged_aot_graph,
             Recovers(r"did not load", {("aot_autograd", "corrupt"): 1,
                                        ("aot_autograd", "misses"): 1,
                                        ("aot_autograd", "hits"): 0})),
    CacheRow("executable entry not an executable", damaged_executable,
             Recovers(CORRUPT_ONCE, {("executable/disk", "corrupt"): 1,
                                     ("executable/disk", "misses"): 1,
                                     ("executable/disk", "hits"): 0}),
             note="already correct: a PJRT deserialization failure was counted corrupt"),
    CacheRow("Dynamo entry not a pickle",
             damaged_payload("dynamo", b"\x80\x05garbage", workload=dynamo_frame),
             Recovers(CORRUPT_ONCE, {("dynamo", "corrupt"): 1, ("dynamo", "hits"): 0,
                                     ("dynamo", "frames_loaded"): 0}),
             workload=dynamo_frame,
             note="already correct: the Dynamo cache discarded an entry that did not unpickle"),
    CacheRow("Dynamo entry whose guards do not unpickle", damaged_dynamo_guards,
             Recovers(CORRUPT_ONCE, {("dynamo", "corrupt"): 1, ("dynamo", "hits"): 0,
                                     ("dynamo", "frames_loaded"): 0}),
             workload=dynamo_frame),
    CacheRow("entries in the older frame format", older_format,
             Recovers(None, {("executable/disk", "hits"): 0,
                             ("executable/disk", "corrupt"): 0,
                             ("lowering", "corrupt"): 0, ("lowering", "misses"): 1})),
    # Item 17: a cache others can write is not read.
    CacheRow("world-writable cache dir holding another function's StableHLO", world_writable,
             Recovers(r"writable by other users", {("lowering", "hits"): 0,
                                                   ("aot_autograd", "hits"): 0})),
    CacheRow("cache dir owned by another user", owned_by_another_user,
             Recovers(r"owned by uid", {("lowering", "hits"): 0, ("aot_autograd", "hits"): 0})),
    CacheRow("keyed shared remote, entries signed", keyed_remote(plant_unsigned=False),
             Recovers(None, {("executable/remote", "hits"): 1, ("lowering", "hits"): 1,
                             ("aot_autograd", "hits"): 1}),
             note="already correct (the remote was read unchecked): with a key it still is"),
    CacheRow("keyed shared remote, unsigned entries planted", keyed_remote(plant_unsigned=True),
             Recovers(r"not signed", {("executable/remote", "hits"): 0,
                                      ("executable/remote", "untrusted"): 1,
                                      ("lowering", "hits"): 0, ("aot_autograd", "hits"): 0})),
    CacheRow("signed entry of another function under this one's name", swapped_signed_entries,
             Recovers(CORRUPT_ONCE + "|another key", {("lowering", "hits"): 0})),
]


@pytest.mark.parametrize("row", CACHE_ROWS, ids=lambda row: row.case)
def test_cache_fault(row: CacheRow, world: World, caplog):
    row.inject(world)
    row.expect.check(world, row.workload, caplog)
    assert world.fired, "the fault was never met"


# --- artifacts -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mlp_artifact(tmp_path_factory):
    """A saved artifact of a small MLP, and its model and input."""
    model, (x,) = aot_factories.mlp()
    path = str(tmp_path_factory.mktemp("faults-aot") / "mlp.tpu")
    with config.patch(matmul_precision="highest"):
        aot.compile(model, (x,)).save(path)
    return path, model, x


def rewrite(src: str, dst: str, change: Callable[[dict], dict] = lambda m: m,
            extra: tuple = ()) -> None:
    """Copy the artifact ``src`` to ``dst`` with its members changed by ``change`` and a
    checksum table that matches them: only the contents are at fault, not the checksums.
    ``extra``: (name, data, compress_type, listed in the checksum table) members added."""
    with zipfile.ZipFile(src) as zf:
        members = {n: zf.read(n) for n in zf.namelist() if n != "CHECKSUMS"}
    members = change(members)
    table = {name: hashlib.sha256(data).hexdigest() for name, data in members.items()}
    with zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        for name, data, compress_type, listed in extra:
            zf.writestr(zipfile.ZipInfo(name), data, compress_type=compress_type)
            if listed:
                table[name] = hashlib.sha256(data).hexdigest()
        zf.writestr("CHECKSUMS", json.dumps(table))


def edit_manifest(edit: Callable[[dict], None]) -> Callable[[dict], dict]:
    def change(members: dict) -> dict:
        manifest = json.loads(members["manifest.json"])
        edit(manifest)
        return {**members, "manifest.json": json.dumps(manifest).encode()}
    return change


def replace_member(name: str, data: bytes) -> Callable[[dict], dict]:
    return lambda members: {**members, name: data}


def retype_safetensors(name: str, members: dict) -> dict:
    """The safetensors member ``name`` with every float32 tensor declared int32: same sizes,
    other bits."""
    blob = members[name]
    (length,) = struct.unpack_from("<Q", blob)
    header = json.loads(blob[8:8 + length])
    for key, info in header.items():
        if key != "__metadata__" and info["dtype"] == "F32":
            info["dtype"] = "I32"
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    return {**members, name: struct.pack("<Q", len(head)) + head + blob[8 + length:]}


def retype_params(members: dict) -> dict:
    return retype_safetensors("params.safetensors", members)


def retype_examples(members: dict) -> dict:
    return retype_safetensors("example_inputs.safetensors", members)


BOMB = bytes(64 << 20)  # 64 MiB of zeros, some 64 KiB deflated


@dataclasses.dataclass(frozen=True)
class Refused:
    """``aot.load`` raises ArtifactError naming ``member`` (and matching ``match``); ``never
    inflated``: members that must not even be read; the CLI's ``run`` exits 2."""

    member: str
    match: str = ""
    never_inflated: tuple = ()


@dataclasses.dataclass(frozen=True)
class ArtifactRow:
    """``case``, the ``damage`` done to a good artifact, the refusal to ``expect``, and a
    ``note`` as for cache rows."""

    case: str
    damage: Callable[[str, str], None]      # (good artifact, path to write) -> None
    expect: Refused
    note: str = ""


def damaged(change=lambda m: m, extra=()):
    return lambda src, dst: rewrite(src, dst, change, extra)


def bad_input_shape(manifest):
    manifest["inputs"][0]["shape"] = "abc"


def bad_arg_index(manifest):
    manifest["programs"][0]["arg_indices"].append(99)


def input_dtype_lie(manifest):
    manifest["inputs"][0]["dtype"] = "int32"  # float32 in the program: same size, other bits


def state_alias_to_nowhere(manifest):
    manifest["state_aliases"] = {"0.weight": "no such tensor"}


ARTIFACT_ROWS = [
    # Item 13: sizes and names are checked from the zip directory before inflating anything.
    ArtifactRow("deflated bomb, extra member not in the table",
                damaged(extra=[("junk.bin", BOMB, zipfile.ZIP_DEFLATED, False)]),
                Refused("junk.bin", never_inflated=("junk.bin",))),
    ArtifactRow("deflated bomb under a member name, in the table",
                damaged(extra=[("example_inputs.safetensors", BOMB, zipfile.ZIP_DEFLATED,
                                True)],
                        change=lambda m: {k: v for k, v in m.items()
                                          if k != "example_inputs.safetensors"}),
                Refused("example_inputs.safetensors",
                        never_inflated=("example_inputs.safetensors",))),
    ArtifactRow("small extra member, in the table",
                damaged(extra=[("notes.txt", b"hello", zipfile.ZIP_STORED, True)]),
                Refused("notes.txt", "not part of")),
    # Item 14: malformed members with valid checksums.
    ArtifactRow("manifest not JSON", damaged(replace_member("manifest.json", b"{not json")),
                Refused("manifest.json")),
    ArtifactRow("manifest without programs",
                damaged(edit_manifest(lambda m: m.pop("programs"))),
                Refused("manifest.json", "programs")),
    ArtifactRow("input spec shape not a list", damaged(edit_manifest(bad_input_shape)),
                Refused("manifest.json", "shape")),
    ArtifactRow("program argument index out of range", damaged(edit_manifest(bad_arg_index)),
                Refused("manifest.json", "arg_indices")),
    ArtifactRow("output structure not JSON",
                damaged(edit_manifest(lambda m: m.update(out_spec="[1, {"))),
                Refused("manifest.json", "out_spec")),
    ArtifactRow("input structure not JSON",
                damaged(edit_manifest(lambda m: m.update(in_spec="[1, {"))),
                Refused("manifest.json", "in_spec"),
                note="was a warning, and inputs were then bound by position"),
    ArtifactRow("state alias to a tensor that is not there",
                damaged(edit_manifest(state_alias_to_nowhere)),
                Refused("manifest.json", "no such tensor")),
    ArtifactRow("params not safetensors",
                damaged(replace_member("params.safetensors", b"\x08" + bytes(15))),
                Refused("params.safetensors")),
    ArtifactRow("example inputs not safetensors",
                damaged(replace_member("example_inputs.safetensors", b"garbage!garbage!")),
                Refused("example_inputs.safetensors")),
    # Item 15: dtypes that lie with the same byte size.
    ArtifactRow("input dtype int32 for float32", damaged(edit_manifest(input_dtype_lie)),
                Refused("manifest.json", "int32")),
    ArtifactRow("params float32 stored as int32", damaged(retype_params),
                Refused("params.safetensors", "int32")),
    ArtifactRow("example inputs float32 stored as int32", damaged(retype_examples),
                Refused("example_inputs.safetensors", "int32")),
    ArtifactRow("executable of a program the manifest does not have",
                damaged(extra=[("executables/cpu/other.bin", b"x", zipfile.ZIP_STORED, True)]),
                Refused("executables/cpu/other.bin", "not part of")),
    ArtifactRow("checksum table not JSON",
                lambda src, dst: _with_checksums(src, dst, b"{oops"),
                Refused("CHECKSUMS"),
                note="was an ArtifactError already, but did not name the member"),
]


def _with_checksums(src: str, dst: str, table: bytes) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            zout.writestr(name, table if name == "CHECKSUMS" else zin.read(name))


@pytest.mark.parametrize("row", ARTIFACT_ROWS, ids=lambda row: row.case)
def test_artifact_fault(row: ArtifactRow, mlp_artifact, tmp_path, monkeypatch, capsys):
    path = str(tmp_path / "damaged.tpu")
    row.damage(mlp_artifact[0], path)
    opened = []
    real_open = zipfile.ZipFile.open

    def open_(self, name, *args, **kwargs):
        opened.append(name.filename if isinstance(name, zipfile.ZipInfo) else name)
        return real_open(self, name, *args, **kwargs)
    monkeypatch.setattr(zipfile.ZipFile, "open", open_)
    with pytest.raises(aot.ArtifactError) as raised:
        aot.load(path)
    message = str(raised.value)
    assert row.expect.member in message, message
    assert re.search(row.expect.match, message), message
    for name in row.expect.never_inflated:
        assert name not in opened
    capsys.readouterr()
    assert aot_cli(["run", path]) == 2
    assert row.expect.member in capsys.readouterr().err


def test_aliased_inputs_save_load_and_run(tmp_path):
    """Item 16: inputs that are one tensor (f(a, a)) save, load and run, also on other inputs."""
    a = torch.linspace(-1, 1, 6).reshape(2, 3)
    path = str(tmp_path / "aliased.tpu")
    aot.compile(lambda x, y: x * 2 + y, (a, a)).save(path)
    run = aot.load(path)
    torch.testing.assert_close(run.run_example(), a * 2 + a)
    b = torch.randn(2, 3)
    torch.testing.assert_close(run(a, b), a * 2 + b)
