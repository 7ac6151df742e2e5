"""The artifact file: a zip of named members, each checked against a SHA-256 on read.

Members: ``manifest.json`` (specs, versions, precision, programs), per program
``stablehlo/<program>.portable`` (portable StableHLO at jaxlib's version) and
``executables/<platform>/<program>.bin`` (serialized PJRT executables), ``params.safetensors``,
optionally ``example_inputs.safetensors``, and ``CHECKSUMS``. A static artifact has one program,
``static``; one with dynamic dims has one per bucket (``bucket_8``, ``bucket_8x128``, ...).

A serialized executable is code: load artifacts only from places you trust.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import zipfile

from ..errors import TorchTPUError

FORMAT = "torchtpu-aot"
# 2: one program per bucket (version 1 had a single program); 3: "view" output slots (outputs
# rebuilt as views of inputs or of other outputs) and "check" slots (index checks), which a
# version-2 reader cannot read; 4: "program" slots with a memory order (outputs computed in
# eager's memory order, restrided at load), which an older reader would return permuted.
FORMAT_VERSION = 4
#: Versions this loader reads: a version 2 artifact has no views or checks, a version 3 one no
#: memory orders, and each runs as before.
READABLE_VERSIONS = (2, 3, 4)


def portable_member(program: str) -> str:
    return f"stablehlo/{program}.portable"


def executable_member(platform: str, program: str) -> str:
    return f"executables/{platform}/{program}.bin"


class ArtifactError(TorchTPUError):
    """An artifact that is missing, truncated, tampered with, or not ours."""


def write_members(path: str, members: dict) -> None:
    """Write ``{name: bytes}`` plus their checksums to ``path`` atomically."""
    checksums = {name: hashlib.sha256(data).hexdigest() for name, data in members.items()}
    directory = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(directory):  # else the error would name our temporary file
        raise FileNotFoundError(f"cannot save {path!r}: parent directory {directory!r} does "
                                f"not exist")
    tmp = _new_file_beside(directory)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
            for name, data in members.items():
                zf.writestr(name, data)
            zf.writestr("CHECKSUMS", json.dumps(checksums, indent=1, sort_keys=True))
        os.replace(tmp, path)  # nothing half-written is ever at ``path``
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _new_file_beside(directory: str) -> str:
    """A new empty file in ``directory`` with the mode ``open()`` and ``torch.save`` give
    (0666 less the umask): an artifact is meant to be shared, unlike ``mkstemp``'s 0600."""
    for _ in range(100):
        tmp = os.path.join(directory, f".tmp-artifact-{os.urandom(6).hex()}")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"no free temporary name in {directory!r}")


#: Most a checksum table may hold; a manifest's is far larger than any we write.
_CHECKSUMS_LIMIT = 1 << 20
_MANIFEST_LIMIT = 64 << 20
#: The member names the format has (the manifest then says which programs and platforms).
_MEMBER_NAMES = re.compile(r"manifest\.json|CHECKSUMS|params\.safetensors|"
                           r"example_inputs\.safetensors|stablehlo/[A-Za-z0-9_]+\.portable|"
                           r"executables/[A-Za-z0-9_]+/[A-Za-z0-9_]+\.bin")


def _check_directory(path: str, infos: list) -> None:
    """Refuse, from the zip directory alone, what could cost memory or is not ours: names the
    format does not have, repeated names, compressed members (we write them stored, so a
    member's size in memory is its size in the file) and members that overlap."""
    seen = set()
    for info in infos:
        name = info.filename
        if not _MEMBER_NAMES.fullmatch(name):
            raise ArtifactError(f"{path!r}: member {name!r} is not part of a torchtpu artifact")
        if name in seen:
            raise ArtifactError(f"{path!r}: member {name!r} appears twice")
        seen.add(name)
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
            raise ArtifactError(f"{path!r}: member {name!r} is compressed ({info.file_size:,} "
                                f"bytes from {info.compress_size:,}); torchtpu stores members "
                                f"uncompressed, so this file was repacked or crafted")
    if sum(info.compress_size for info in infos) > os.path.getsize(path):
        raise ArtifactError(f"{path!r}: its members are larger together than the file (they "
                            f"overlap); the file was crafted")


def _read(zf, path: str, info, limit: int | None = None) -> bytes:
    if limit is not None and info.file_size > limit:
        raise ArtifactError(f"{path!r}: member {info.filename!r} has {info.file_size:,} bytes, "
                            f"more than a torchtpu artifact's ({limit:,})")
    return zf.read(info)


def read_members(path: str) -> dict:
    """Every member of the artifact at ``path``, verified; ArtifactError on any mismatch.

    Sizes and names are checked from the zip directory and the checksum table and manifest
    are read and checked first; only then are the other members read, each checked against
    its SHA-256.
    """
    from . import manifest as manifest_format

    if not os.path.exists(path):
        raise ArtifactError(f"no artifact at {path!r}")
    try:
        with zipfile.ZipFile(path) as zf:
            infos = {info.filename: info for info in zf.infolist()}
            _check_directory(path, list(zf.infolist()))
            if "CHECKSUMS" not in infos or "manifest.json" not in infos:
                raise ArtifactError(f"{path!r} is not a torchtpu artifact (no manifest or "
                                    f"checksums)")
            checksums = _checksum_table(path, _read(zf, path, infos.pop("CHECKSUMS"),
                                                    _CHECKSUMS_LIMIT))
            if set(checksums) != set(infos):
                raise ArtifactError(f"{path!r}: members {sorted(set(checksums) ^ set(infos))} "
                                    f"do not match the checksum table; the file was modified")
            members = {"manifest.json": _verified(
                path, "manifest.json", _read(zf, path, infos.pop("manifest.json"),
                                             _MANIFEST_LIMIT), checksums)}
            manifest = manifest_format.parse(path, members["manifest.json"])
            expected = manifest_format.expected_members(manifest)
            for name in infos:
                if name not in expected:
                    raise ArtifactError(f"{path!r}: member {name!r} is not part of this "
                                        f"artifact (its manifest has no such program)")
            for name, info in infos.items():
                members[name] = _verified(path, name, _read(zf, path, info), checksums)
    except ArtifactError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, zipfile.LargeZipFile) as exc:
        raise ArtifactError(f"{path!r} is not a readable torchtpu artifact (truncated or "
                            f"damaged?): {exc}") from exc
    except Exception as exc:  # zlib/CRC errors surface under several types
        raise ArtifactError(f"{path!r} is damaged: {exc}") from exc
    for name in ("params.safetensors",) + tuple(portable_member(p["name"])
                                                for p in manifest["programs"]):
        if name not in members:
            raise ArtifactError(f"{path!r}: member {name!r} is missing")
    return members


def _checksum_table(path: str, data: bytes) -> dict:
    try:
        checksums = json.loads(data)
    except ValueError as exc:
        raise ArtifactError(f"{path!r}: its checksum table (CHECKSUMS) is damaged") from exc
    if not isinstance(checksums, dict) or not all(isinstance(v, str)
                                                  for v in checksums.values()):
        raise ArtifactError(f"{path!r}: its checksum table (CHECKSUMS) is damaged")
    return checksums


def _verified(path: str, name: str, data: bytes, checksums: dict) -> bytes:
    if hashlib.sha256(data).hexdigest() != checksums[name]:
        raise ArtifactError(f"{path!r}: checksum mismatch in {name!r}; the file was "
                            f"modified or damaged. Export it again.")
    return data


@contextlib.contextmanager
def decoding(path: str, member: str):
    """Turn any failure to read ``member`` of the artifact at ``path`` into an ArtifactError
    naming it: a member whose checksum is right can still be malformed.

    Example::

        with decoding(path, "params.safetensors"):
            state = load_tensors(members["params.safetensors"])
    """
    try:
        yield
    except ArtifactError:
        raise
    except Exception as exc:
        raise ArtifactError(f"{path!r}: member {member!r} is malformed ({type(exc).__name__}: "
                            f"{exc})") from exc
