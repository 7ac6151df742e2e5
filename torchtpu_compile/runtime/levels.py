"""Byte entries cached at three levels, for the caches above the executable cache.

The executable cache (``executable.py``) has its own loop because a hit there is a PJRT
deserialization; the graph caches above it (aot_autograd results, lowered StableHLO) store plain
bytes and share this one. Their entries live in a ``graphs/`` folder beside the executables, on
disk and on the remote, framed with a SHA-256 like every entry (``cache.pack``): a damaged entry,
or one whose payload the cache above cannot decode, is discarded and recomputed, never loaded.

Example::

    lowering = Levels("lowering")
    payload = lowering.get(key, decode=check)   # None if absent or damaged; counted in stats()
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
_UNUSABLE = object()  # what ``Levels._decoded`` gives for an entry that did not decode


def _stores() -> list:
    """Disk and remote stores of the graph levels, built once per configuration."""
    return cache_store.configured_stores(SUBDIR)


class Levels:
    """One graph cache (``name``), looked up in this process, then on disk, then remote.

    A hit at a lower level fills the levels above it. An entry whose frame does not check out,
    or whose payload the caller's ``decode`` cannot read, is discarded at its level and counted
    ``corrupt``; the lookup goes on below it and, with nothing usable anywhere, is a miss.
    Counters go to ``stats()["graph_cache"][name]``: hits, misses, corrupt, untrusted,
    bytes_read, bytes_written, seconds_saved.
    """

    def __init__(self, name: str):
        self.name = name
        self._memory: dict = {}
        self._served: dict = {}  # key -> (bytes, seconds) of its last hit, for ``reject``
        self._lock = threading.Lock()

    def get(self, key: str, decode=None):
        """The payload stored under ``key``, passed through ``decode`` when given (any
        exception it raises marks the entry corrupt), or None (counted as a miss).

        Example::

            header = lowering.get(key, decode=json.loads)
        """
        with self._lock:
            remembered = self._memory.get(key)
        if remembered is not None:
            payload, seconds = remembered
            value = self._decoded(payload, decode, key, None)
            if value is not _UNUSABLE:
                self._count_hit(key, len(payload), seconds)
                return value
        stores = _stores()
        for depth, store in enumerate(stores):
            found = cache_store.fetch(store, key, self.name)
            if not isinstance(found, tuple):
                if found in ("corrupt", "untrusted"):
                    counters.add_graph_cache(self.name, found)
                continue
            blob, payload, meta = found
            value = self._decoded(payload, decode, key, store)
            if value is _UNUSABLE:
                continue
            for upper in stores[:depth]:
                self._write(upper, key, blob)
            seconds = float(meta.get("compute_seconds") or 0.0)
            with self._lock:
                self._memory[key] = (payload, seconds)
            self._count_hit(key, len(blob), seconds)
            return value
        counters.add_graph_cache(self.name, "misses")
        return None

    def _decoded(self, payload: bytes, decode, key: str, store):
        """``decode(payload)``, or _UNUSABLE after discarding the entry (at ``store``, or in
        this process when None) as corrupt."""
        if decode is None:
            return payload
        try:
            value = decode(payload)
        except Exception as exc:  # whatever the decoder trips on, the entry is unusable
            reason = f"its payload does not decode: {type(exc).__name__}: {exc}"
            counters.add_graph_cache(self.name, "corrupt")
            if store is None:
                with self._lock:
                    self._memory.pop(key, None)
                log.warning("torchtpu: %s cache entry in memory %s", self.name, reason)
            else:
                cache_store.reject(store, key, self.name, reason)
            return _UNUSABLE
        return value

    def reject(self, key: str, reason: str, discard: bool = True) -> None:
        """An entry ``get`` returned that turned out not to load (``reason``): count it corrupt
        and a miss instead of a hit, and discard it at every level (``discard``: unless a good
        one was written in its place since)."""
        with self._lock:
            size, seconds = self._served.pop(key, (0, 0.0))
        counters.add_graph_cache(self.name, "hits", -1)
        counters.add_graph_cache(self.name, "bytes_read", -size)
        counters.add_graph_cache(self.name, "seconds_saved", -seconds)
        counters.add_graph_cache(self.name, "corrupt")
        counters.add_graph_cache(self.name, "misses")
        log.warning("torchtpu: %s cache entry did not load (%s); computed again", self.name,
                    reason)
        if discard:
            self.discard(key)

    def put(self, key: str, payload: bytes, compute_seconds: float = 0.0) -> None:
        """Store ``payload`` at every level; storage failures are logged once, never raised."""
        with self._lock:
            self._memory[key] = (payload, compute_seconds)
        stores = _stores()
        if not stores:
            return
        blob = cache_store.pack(payload, key, compute_seconds=compute_seconds, what=self.name)
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
            self._served.clear()

    def _write(self, store, key: str, blob: bytes) -> None:
        if cache_store.store_entry(store, key, blob, self.name):
            counters.add_graph_cache(self.name, "bytes_written", len(blob))

    def _count_hit(self, key: str, size: int, seconds: float) -> None:
        with self._lock:
            self._served[key] = (size, seconds)
        counters.add_graph_cache(self.name, "hits")
        counters.add_graph_cache(self.name, "bytes_read", size)
        counters.add_graph_cache(self.name, "seconds_saved", seconds)
