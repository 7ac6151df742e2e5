"""Byte entries cached at three levels, for the caches above the executable cache.

The executable cache (``executable.py``) has its own loop because a hit there is a PJRT
deserialization; the graph caches above it (aot_autograd results, lowered StableHLO) store plain
bytes and share this one. Their entries live in a ``graphs/`` folder beside the executables, on
disk and on the remote, framed with a SHA-256 like every entry (``cache.pack``): a damaged entry
is discarded and recomputed, never loaded.

Example::

    lowering = Levels("lowering")
    payload = lowering.get(key)          # bytes or None; counted in stats()["graph_cache"]
    if payload is None:
        payload = compute()
        lowering.put(key, payload, compute_seconds=0.2)
"""
from __future__ import annotations

import threading

from .. import counters
from .._logging import log
from . import cache as cache_store

#: Subfolder (of ``config.cache_dir`` and of the remote) that holds the graph-level entries.
SUBDIR = "graphs"


def _stores() -> list:
    """Disk and remote stores of the graph levels, built once per configuration."""
    return cache_store.configured_stores(SUBDIR, "graph cache")


class Levels:
    """One graph cache (``name``), looked up in this process, then on disk, then remote.

    A hit at a lower level fills the levels above it. Counters go to
    ``stats()["graph_cache"][name]``: hits, misses, corrupt, bytes_read, bytes_written,
    seconds_saved.
    """

    def __init__(self, name: str):
        self.name = name
        self._memory: dict = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None (counted as a miss)."""
        with self._lock:
            remembered = self._memory.get(key)
        if remembered is not None:
            payload, seconds = remembered
            self._count_hit(len(payload), seconds)
            return payload
        stores = _stores()
        for depth, store in enumerate(stores):
            try:
                blob = store.get(key)
            except OSError as exc:  # an unreadable cache is a miss, never a failed compile
                log.warning("torchtpu: %s %s cache unreadable: %s", store.level, self.name, exc)
                continue
            if blob is None:
                continue
            try:
                payload, meta = cache_store.unpack(blob)
            except cache_store.CorruptEntry as exc:
                log.warning("torchtpu: discarding corrupt %s %s cache entry (%s); computing "
                            "it again", store.level, self.name, exc)
                counters.add_graph_cache(self.name, "corrupt")
                store.discard(key)
                continue
            for upper in stores[:depth]:
                self._write(upper, key, blob)
            seconds = float(meta.get("compute_seconds") or 0.0)
            with self._lock:
                self._memory[key] = (payload, seconds)
            self._count_hit(len(blob), seconds)
            return payload
        counters.add_graph_cache(self.name, "misses")
        return None

    def put(self, key: str, payload: bytes, compute_seconds: float = 0.0) -> None:
        """Store ``payload`` at every level; storage failures are logged, never raised."""
        with self._lock:
            self._memory[key] = (payload, compute_seconds)
        stores = _stores()
        if not stores:
            return
        blob = cache_store.pack(payload, compute_seconds=compute_seconds, what=self.name)
        for store in stores:
            self._write(store, key, blob)

    def discard(self, key: str) -> None:
        """Forget ``key`` at every level (an entry that unpacked but did not load)."""
        with self._lock:
            self._memory.pop(key, None)
        for store in _stores():
            store.discard(key)

    def clear_memory(self) -> None:
        """Forget this process's entries (level 1 only)."""
        with self._lock:
            self._memory.clear()

    def _write(self, store, key: str, blob: bytes) -> None:
        try:
            store.put(key, blob)
            counters.add_graph_cache(self.name, "bytes_written", len(blob))
        except OSError as exc:
            log.warning("torchtpu: could not write the %s %s cache: %s", store.level, self.name,
                        exc)

    def _count_hit(self, size: int, seconds: float) -> None:
        counters.add_graph_cache(self.name, "hits")
        counters.add_graph_cache(self.name, "bytes_read", size)
        counters.add_graph_cache(self.name, "seconds_saved", seconds)
