"""The artifact file: a zip of named members, each checked against a SHA-256 on read.

Members: ``manifest.json`` (specs, versions, precision, programs), per program
``stablehlo/<program>.portable`` (portable StableHLO at jaxlib's version) and
``executables/<platform>/<program>.bin`` (serialized PJRT executables), ``params.safetensors``,
optionally ``example_inputs.safetensors``, and ``CHECKSUMS``. A static artifact has one program,
``static``; one with dynamic dims has one per bucket (``bucket_8``, ``bucket_8x128``, ...).

A serialized executable is code: load artifacts only from places you trust.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile

from ..errors import TorchTPUError

FORMAT = "torchtpu-aot"
FORMAT_VERSION = 3  # 3: index checks (an output slot of kind "check"); 2: one program per
#                      bucket (version 1 had a single program)
#: Versions this loader reads: a version 2 artifact has no index checks and runs as before.
READABLE_VERSIONS = (2, 3)


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
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-artifact-")
    os.close(fd)
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


def read_members(path: str) -> dict:
    """Every member of the artifact at ``path``, verified; ArtifactError on any mismatch."""
    if not os.path.exists(path):
        raise ArtifactError(f"no artifact at {path!r}")
    try:
        with zipfile.ZipFile(path) as zf:
            members = {name: zf.read(name) for name in zf.namelist()}
    except (zipfile.BadZipFile, EOFError, OSError, zipfile.LargeZipFile) as exc:
        raise ArtifactError(f"{path!r} is not a readable torchtpu artifact (truncated or "
                            f"damaged?): {exc}") from exc
    except Exception as exc:  # zlib/CRC errors surface under several types
        raise ArtifactError(f"{path!r} is damaged: {exc}") from exc
    if "CHECKSUMS" not in members or "manifest.json" not in members:
        raise ArtifactError(f"{path!r} is not a torchtpu artifact (no manifest or checksums)")
    try:
        checksums = json.loads(members.pop("CHECKSUMS"))
    except ValueError as exc:
        raise ArtifactError(f"{path!r}: its checksum table is damaged") from exc
    if set(checksums) != set(members):
        raise ArtifactError(f"{path!r}: members {sorted(set(checksums) ^ set(members))} do "
                            f"not match the checksum table; the file was modified")
    for name, data in members.items():
        if hashlib.sha256(data).hexdigest() != checksums[name]:
            raise ArtifactError(f"{path!r}: checksum mismatch in {name!r}; the file was "
                                f"modified or damaged. Export it again.")
    manifest = json.loads(members["manifest.json"])
    if manifest.get("format") != FORMAT:
        raise ArtifactError(f"{path!r} is not a torchtpu artifact")
    if manifest.get("format_version") not in READABLE_VERSIONS:
        raise ArtifactError(f"{path!r} has format version {manifest.get('format_version')}; "
                            f"this torchtpu reads versions "
                            f"{', '.join(map(str, READABLE_VERSIONS))}")
    return members
