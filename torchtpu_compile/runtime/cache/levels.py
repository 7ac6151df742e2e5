"""The one cache loop: a value by key, looked up in this process, then on the host disk, then on
a remote store, and computed by the caller only when no level has it.

Every cache of torchtpu is one ``Levels`` with its own codec (``codecs.py``): compiled
executables (``runtime/executable.py``), lowered StableHLO (``lower/cache.py``), aot_autograd
results (``graph_cache.py``) and Dynamo's output per frame (``dynamo_cache.py``). Level 1 holds
decoded values; levels 2 and 3 hold framed, checked entries (``frame.py``) in the configured
stores (``stores.py``): executables at the roots of ``config.cache_dir`` and
``config.remote_cache``, the caches above them in a ``graphs/`` folder there.

A hit at a lower level fills the levels above it. An entry that cannot be read, is not to be
trusted, or whose frame or payload does not check out is a miss at its level (counted, with one
warning per store); a damaged one is discarded. Nothing a store does raises to the caller.

Counters, one schema for every cache, in ``stats()["caches"][name]``: for each level
("process", "disk", "remote") and for the cache as a whole ("all"), ``hits``, ``misses``,
``corrupt``, ``untrusted``, ``bytes_read``, ``bytes_written`` and ``seconds_saved`` (what
computing the values served took, as recorded when they were stored). A lookup counts a miss at
each level it looked at without finding a usable entry, and under "all" once if no level had
one; "all" also holds the events a cache declares (``events``), such as "bypasses".

Example::

    lowering = Levels("lowering", LoweringCodec(), folder=GRAPH_FOLDER)
    lowered = lowering.get(key)          # None if no level has it; counted in stats()
    if lowered is None:
        lowered = lower(graph)
        lowering.put(key, lowered, compute_seconds=0.2)
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any

from ... import counters
from ..._logging import log
from ...profiling import TORCH_PROFILER, span
from .codecs import Codec
from .frame import pack
from .recent import RecentlyUsed
from .stores import configured_stores, discard_corrupt, fetch, store_entry

#: The folder (in ``config.cache_dir`` and in the remote) of the caches above the executables.
GRAPH_FOLDER = "graphs"

_PROCESS = "process"


@dataclasses.dataclass
class Lookup:
    """What one lookup of ``key`` found: ``value`` (None: nothing usable), the ``level`` it came
    from, the ``size`` of the entry read there (0 in this process), the ``seconds`` computing it
    took, and every level ``looked`` at, in order."""

    key: str
    value: Any = None
    level: str | None = None
    size: int = 0
    seconds: float = 0.0
    looked: tuple = ()


class Levels:
    """One cache (``name``) at three levels, its values turned into bytes by ``codec``.

    ``folder``: the subfolder of each store root its entries live in (None: the roots);
    ``events``: names of counters of its own, kept under "all" (``count_event``);
    ``kept``: the setting that bounds its process level (``recent.py``).
    """

    def __init__(self, name: str, codec: Codec, folder: str | None = None,
                 events: tuple = (), kept: str = "process_cache_entries"):
        self.name = name
        self.codec = codec
        self.folder = folder
        # key -> (value, seconds computing it took); bounded: values may be compiled programs
        self._memory = RecentlyUsed(kept)
        self._served = RecentlyUsed(kept)  # key -> (level, size, seconds) of its last hit
        self._lock = threading.Lock()
        counters.declare_cache(name, events)

    def stores(self) -> list:
        """The disk and remote stores of this cache, as configured now (fastest first)."""
        return configured_stores(self.folder)

    def get(self, key: str, codec: Codec | None = None):
        """The value stored under ``key`` at the fastest level that has a usable one, or None;
        counted as a hit or a miss. ``codec``: this entry's codec, where decoding needs more
        than the cache knows (an executable's devices), else the cache's.

        Example::

            exe = executables.get(key, codec=ExecutableCodec(replicas=(0, 1)))
        """
        if TORCH_PROFILER._is_profiler_enabled:
            return self._get_profiled(key, codec)
        with self._lock:
            held = self._memory.get(key)
            if held is not None:
                self._served[key] = (_PROCESS, 0, held[1])
        if held is not None:  # the common case, kept short: it is what a compile meets most
            counters.add_cache(self.name, {_PROCESS: {"hits": 1, "seconds_saved": held[1]}})
            return held[0]
        found = self.lookup(key, codec)
        self.count(found)
        return found.value

    def _get_profiled(self, key: str, codec: Codec | None):
        """``get`` in a span ``torchtpu::cache <name>`` holding one that names the level that
        answered (or ``miss``): ``key_averages()`` then counts lookups per level."""
        with span(f"torchtpu::cache {self.name}"):
            found = self.lookup(key, codec)
            self.count(found)
            with span(f"torchtpu::cache {self.name} {found.level or 'miss'}", bytes=found.size):
                pass
        return found.value

    def lookup(self, key: str, codec: Codec | None = None) -> Lookup:
        """What ``get`` finds, without counting a hit or a miss (``count`` does, once the
        caller knows whether the value is of use). Faults met on the way (corrupt, untrusted
        entries) and the writes filling faster levels are counted: they happened."""
        with self._lock:
            held = self._memory.get(key)
        if held is not None:
            return Lookup(key, held[0], _PROCESS, 0, held[1], (_PROCESS,))
        looked = [_PROCESS]
        stores = self.stores()
        for depth, store in enumerate(stores):
            looked.append(store.level)
            found = fetch(store, key, self.name)
            if not isinstance(found, tuple):
                if found in ("corrupt", "untrusted"):
                    self._add(store.level, **{found: 1})
                continue
            blob, payload, meta = found
            try:
                value = (codec or self.codec).decode(payload)
            except Exception as exc:  # whatever the codec trips on, the entry is unusable
                discard_corrupt(store, key, self.name,
                                f"its payload does not decode: {type(exc).__name__}: {exc}")
                self._add(store.level, corrupt=1)
                continue
            for upper in stores[:depth]:
                self._write(upper, key, blob)
            seconds = float(meta.get("compute_seconds") or 0.0)
            with self._lock:
                self._memory[key] = (value, seconds)
            return Lookup(key, value, store.level, len(blob), seconds, tuple(looked))
        return Lookup(key, looked=tuple(looked))

    def count(self, found: Lookup, used: bool = True) -> None:
        """Count ``found`` (from ``lookup``) as a hit at its level, or as a miss at every level
        looked at where there was nothing, or nothing ``used``."""
        hit = used and found.level is not None
        missed = found.looked[:-1] if hit else found.looked
        changes = {level: {"misses": 1} for level in missed}
        if hit:
            changes[found.level] = {"hits": 1, "bytes_read": found.size,
                                    "seconds_saved": found.seconds}
            with self._lock:
                self._served[found.key] = (found.level, found.size, found.seconds)
        else:
            changes["all"] = {"misses": 1}
        counters.add_cache(self.name, changes)

    def count_event(self, event: str, value=1) -> None:
        """Add to one of this cache's own counters (``events``), under "all"."""
        counters.add_cache(self.name, {"all": {event: value}})

    def put(self, key: str, value, compute_seconds: float = 0.0,
            codec: Codec | None = None) -> None:
        """Keep ``value`` at every level; ``compute_seconds``: what computing it took (what a
        later hit saves). A value the codec cannot encode stays in this process only; storage
        failures are logged once, never raised."""
        with self._lock:
            self._memory[key] = (value, compute_seconds)
        stores = self.stores()
        if not stores:
            return
        try:
            payload = (codec or self.codec).encode(value)
        except Exception as exc:  # some PJRT plugins cannot serialize: a cache is optional
            log.debug("torchtpu: %s cache entry kept in this process only: %s", self.name, exc)
            return
        blob = pack(payload, key, compute_seconds=compute_seconds, what=self.name)
        for store in stores:
            self._write(store, key, blob)

    def reject(self, key: str, reason: str, discard: bool = True) -> None:
        """An entry ``get`` returned that turned out not to load (``reason``): count it corrupt
        and a miss instead of a hit, and discard it at every level (``discard``: unless a good
        one was written in its place since)."""
        with self._lock:
            served = self._served.pop(key, None)
        level, size, seconds = served or (_PROCESS, 0, 0.0)  # (it was served; where, unknown)
        counters.add_cache(self.name, {
            level: {"hits": -1 if served else 0, "bytes_read": -size, "seconds_saved": -seconds,
                    "corrupt": 1, "misses": 1},
            "all": {"misses": 1}})
        log.warning("torchtpu: %s cache entry did not load (%s); computed again", self.name,
                    reason)
        if discard:
            self.discard(key)

    def discard(self, key: str) -> None:
        """Forget ``key`` at every level."""
        with self._lock:
            self._memory.pop(key, None)
            self._served.pop(key, None)
        for store in self.stores():
            store.discard(key)

    def clear_memory(self) -> None:
        """Forget this process's entries (level 1 only), as a new process has none."""
        with self._lock:
            self._memory.clear()
            self._served.clear()

    def _write(self, store, key: str, blob: bytes) -> None:
        if store_entry(store, key, blob, self.name):
            self._add(store.level, bytes_written=len(blob))

    def _add(self, level: str, **changes) -> None:
        counters.add_cache(self.name, {level: changes})
