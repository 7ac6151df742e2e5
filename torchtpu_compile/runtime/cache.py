"""Levels 2 and 3 of the compile cache: compiled executables on host disk and on a remote store.

Level 1 (this process) lives in ``executable.py``. An entry is a serialized PJRT executable
framed with its SHA-256, so a truncated or tampered entry is detected, discarded and compiled
again; it is never loaded.

Example::

    store = DiskStore("/tmp/torchtpu-cache", max_bytes=1 << 30)
    store.put("key", pack(b"...", compile_seconds=1.2))
    payload, meta = unpack(store.get("key"))
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import queue
import struct
import tempfile
import threading

from .._logging import log

_MAGIC = b"TTPUX1\n"


class CorruptEntry(ValueError):
    """A cache entry whose frame or checksum is wrong."""


def pack(payload: bytes, **meta) -> bytes:
    """Frame ``payload`` with its checksum and a small JSON header."""
    header = json.dumps({**meta, "sha256": hashlib.sha256(payload).hexdigest(),
                         "size": len(payload)}).encode()
    return _MAGIC + struct.pack("<I", len(header)) + header + payload


def unpack(blob: bytes) -> tuple[bytes, dict]:
    """The payload and header of a framed entry; CorruptEntry if anything does not check out."""
    if not blob.startswith(_MAGIC) or len(blob) < len(_MAGIC) + 4:
        raise CorruptEntry("not a torchtpu cache entry")
    (length,) = struct.unpack_from("<I", blob, len(_MAGIC))
    start = len(_MAGIC) + 4
    try:
        meta = json.loads(blob[start:start + length])
    except ValueError as exc:
        raise CorruptEntry("unreadable header") from exc
    payload = blob[start + length:]
    if len(payload) != meta.get("size") or hashlib.sha256(payload).hexdigest() != meta.get("sha256"):
        raise CorruptEntry("checksum mismatch (truncated or modified)")
    return payload, meta


def entry_name(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest() + ".xla"


class DiskStore:
    """Entries as files in one directory; atomic writes, least-recently-used eviction."""

    level = "disk"

    def __init__(self, directory: str, max_bytes: int):
        self.directory = os.path.expanduser(directory)
        self.max_bytes = max_bytes
        os.makedirs(self.directory, exist_ok=True)

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, entry_name(key))

    def get(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except FileNotFoundError:
            return None
        try:
            os.utime(path)  # recency for LRU eviction
        except OSError:
            pass
        return blob

    def put(self, key: str, blob: bytes) -> None:
        # A temp file in the same directory, then an atomic rename: readers in other processes
        # see the old entry, no entry, or the whole new one, never a part.
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, self._path(key))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self.evict()

    def discard(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except OSError:
            pass

    def evict(self) -> None:
        """Delete least-recently-used entries until the directory fits in ``max_bytes``."""
        entries = []
        for name in os.listdir(self.directory):
            if not name.endswith(".xla"):
                continue
            path = os.path.join(self.directory, name)
            try:
                st = os.stat(path)
            except OSError:
                continue  # removed meanwhile by another process
            entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            try:
                os.unlink(path)
                total -= size
            except OSError:
                pass


#: How long a process that exits waits for its queued remote-cache writes.
_EXIT_FLUSH_SECONDS = 60


class RemoteStore:
    """A shared store at a URL: ``file://`` directly, other schemes through fsspec if present.

    Reads are synchronous; writes go to a background thread, and every failure is logged and
    swallowed: the remote can make compiles faster, never make them fail.
    """

    level = "remote"

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        if url.startswith("file://"):
            self._disk = DiskStore(url[len("file://"):], max_bytes=1 << 62)
            self._fs = None
        else:
            self._disk = None
            try:
                import fsspec
            except ImportError as exc:
                raise ValueError(
                    f"TORCHTPU_REMOTE_CACHE={url!r} needs fsspec (and its {url.split(':')[0]} "
                    f"plugin): pip install fsspec gcsfs / s3fs, or use a file:// URL") from exc
            self._fs, self._root = fsspec.core.url_to_fs(self.url)
        self._writes: queue.Queue = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                        name="torchtpu-remote-cache")
        self._writer.start()
        # The writer is a daemon thread: without this, entries still queued at exit are lost.
        atexit.register(self._flush_at_exit)

    def get(self, key: str) -> bytes | None:
        try:
            if self._disk is not None:
                return self._disk.get(key)
            path = f"{self._root}/{entry_name(key)}"
            if not self._fs.exists(path):
                return None
            with self._fs.open(path, "rb") as f:
                return f.read()
        except Exception as exc:
            log.warning("torchtpu: remote compile cache %s unreadable: %s", self.url, exc)
            return None

    def put(self, key: str, blob: bytes) -> None:
        self._writes.put((key, blob))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until queued writes are done (tests and clean shutdown); False if ``timeout``
        seconds passed first."""
        done = self._writes.all_tasks_done
        with done:
            return done.wait_for(lambda: not self._writes.unfinished_tasks, timeout)

    def _flush_at_exit(self) -> None:
        if not self.flush(timeout=_EXIT_FLUSH_SECONDS):
            log.warning("torchtpu: %d compile cache entries were not written to %s before exit "
                        "(gave up after %d s)", self._writes.unfinished_tasks, self.url,
                        _EXIT_FLUSH_SECONDS)

    def discard(self, key: str) -> None:
        try:
            if self._disk is not None:
                self._disk.discard(key)
            else:
                self._fs.rm(f"{self._root}/{entry_name(key)}")
        except Exception as exc:
            log.warning("torchtpu: could not remove a corrupt remote cache entry: %s", exc)

    def _write_loop(self) -> None:
        while True:
            key, blob = self._writes.get()
            try:
                if self._disk is not None:
                    self._disk.put(key, blob)
                else:
                    tmp = f"{self._root}/.tmp-{os.getpid()}-{entry_name(key)}"
                    with self._fs.open(tmp, "wb") as f:
                        f.write(blob)
                    self._fs.mv(tmp, f"{self._root}/{entry_name(key)}")
            except Exception as exc:
                log.warning("torchtpu: remote compile cache %s write failed: %s", self.url, exc)
            finally:
                self._writes.task_done()


_configured_lock = threading.Lock()
_configured: dict = {}


def configured_stores(subdir: str | None = None, what: str = "compile cache") -> list:
    """The disk and remote stores ``config`` asks for now, under ``subdir`` of each root.

    Built once per configuration and subdir, and shared: the executable cache uses the roots,
    the graph caches (``levels.py``) a ``graphs/`` folder in them. A misconfigured remote is
    logged and left out, never fatal. With a ``subdir``, so is an unwritable disk folder.

    Example::

        for store in configured_stores("graphs", "graph cache"):
            blob = store.get(key)
    """
    from .. import config
    wanted = (subdir, config.cache_dir, config.cache_max_bytes, config.remote_cache)
    with _configured_lock:
        stores = _configured.get(wanted)
        if stores is not None:
            return stores
        stores = []
        if config.cache_dir:
            if subdir is None:
                stores.append(DiskStore(config.cache_dir, config.cache_max_bytes))
            else:
                try:
                    stores.append(DiskStore(os.path.join(config.cache_dir, subdir),
                                            config.cache_max_bytes))
                except OSError as exc:  # an unwritable cache dir must not stop compiling
                    log.warning("torchtpu: %s on disk disabled: %s", what, exc)
        if config.remote_cache:
            url = config.remote_cache if subdir is None else \
                f"{config.remote_cache.rstrip('/')}/{subdir}"
            try:
                stores.append(RemoteStore(url))
            except Exception as exc:  # a misconfigured remote must not stop compiling
                log.warning("torchtpu: remote %s disabled: %s", what, exc)
        for key in [k for k in _configured if k[0] == subdir]:
            del _configured[key]  # one configuration per subdir at a time, as before
        _configured[wanted] = stores
        return stores
