"""The format of one cache entry: a payload framed with its checksum, the digest of the key it
was stored under and, when ``config.cache_key`` is set, an HMAC-SHA256 signature.

A truncated, modified or misplaced entry fails ``unpack`` with ``CorruptEntry`` (the levels
discard it and compute it again); an intact one not signed with our key fails with
``UntrustedEntry`` (refused, left in place: on a shared store it may be a colleague's).

Example::

    blob = pack(b"payload", "key", compute_seconds=1.2, what="lowering")
    payload, meta = unpack(blob, "key")       # (b"payload", {"compute_seconds": 1.2, ...})
"""
from __future__ import annotations

import hashlib
import hmac
import json
import struct

_MAGIC = b"TTPUX2\n"
_OLD_MAGICS = (b"TTPUX1\n",)
_MAC_SIZE = 32


class CorruptEntry(ValueError):
    """A cache entry whose frame or checksum is wrong, or that was stored under another key."""


class StaleEntry(CorruptEntry):
    """An entry an older torchtpu wrote, in another format: replaced, not reported."""


class UntrustedEntry(ValueError):
    """An intact cache entry we may not load: unsigned or signed with another key while
    ``config.cache_key`` is set, or a file another user put in our cache folder."""


def signing_key() -> bytes | None:
    """The HMAC key derived from ``config.cache_key``, or None when no key is set."""
    from ... import config
    secret = config.cache_key
    if not secret:
        return None
    return hashlib.sha256(b"torchtpu cache key\0" + secret.encode()).digest()


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def entry_name(key: str) -> str:
    """The file name of the entry stored under ``key``, in any store."""
    return key_digest(key) + ".xla"


def pack(payload: bytes, key: str, **meta) -> bytes:
    """Frame ``payload``, stored under ``key``, with its checksum and a small JSON header
    (``meta`` and the frame's own fields); signed when ``config.cache_key`` is set."""
    mac_key = signing_key()
    header = json.dumps({**meta, "key": key_digest(key), "size": len(payload),
                         "sha256": hashlib.sha256(payload).hexdigest(),
                         "signed": mac_key is not None}).encode()
    body = _MAGIC + struct.pack("<I", len(header)) + header + payload
    if mac_key is not None:
        body += hmac.new(mac_key, body, hashlib.sha256).digest()
    return body


def unpack(blob: bytes, key: str | None = None) -> tuple[bytes, dict]:
    """The payload and header of a framed entry; CorruptEntry if anything does not check out
    (with ``key``: also if it was stored under another key), UntrustedEntry if
    ``config.cache_key`` is set and the entry is not signed with it."""
    if blob.startswith(_OLD_MAGICS):
        raise StaleEntry("written by an older torchtpu (another entry format)")
    start = len(_MAGIC) + 4
    if not blob.startswith(_MAGIC) or len(blob) < start:
        raise CorruptEntry("not a torchtpu cache entry")
    (length,) = struct.unpack_from("<I", blob, len(_MAGIC))
    try:
        meta = json.loads(blob[start:start + length])
    except ValueError as exc:
        raise CorruptEntry("unreadable header") from exc
    if not isinstance(meta, dict) or not isinstance(meta.get("size"), int):
        raise CorruptEntry("unreadable header")
    end = start + length + meta["size"]
    payload = blob[start + length:end]
    trailer = blob[end:]
    if len(payload) != meta["size"] or hashlib.sha256(payload).hexdigest() != meta.get("sha256") \
            or len(trailer) != (_MAC_SIZE if meta.get("signed") is True else 0):
        raise CorruptEntry("checksum mismatch (truncated or modified)")
    if key is not None and meta.get("key") != key_digest(key):
        raise CorruptEntry("stored under another key (misplaced or planted)")
    mac_key = signing_key()
    if mac_key is not None:
        if not trailer:
            raise UntrustedEntry("not signed with TORCHTPU_CACHE_KEY")
        if not hmac.compare_digest(hmac.new(mac_key, blob[:end], hashlib.sha256).digest(),
                                   trailer):
            raise UntrustedEntry("signed with another key than TORCHTPU_CACHE_KEY")
    return payload, meta
