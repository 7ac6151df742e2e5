"""Compiling StableHLO with PJRT, behind the three-level compile cache.

Level 1 is this process (a dict); level 2 the host disk (``config.cache_dir``); level 3 an
optional remote (``config.remote_cache``). A hit at a lower level fills the levels above it.

A program with collectives runs on several devices, one replica each (``replicas``: their
ids, in replica order); this process passes and gets the buffers of its own device only.

Example::

    exe = compile_stablehlo(bytecode, fingerprint="ab12...", precision="medium")
    outputs = exe.run([to_buffer(x)])      # list of PJRT buffers
"""
from __future__ import annotations

import threading
import time

from jaxlib import _jax

from .. import counters
from .._logging import log
from ..errors import LoweringError
from . import cache as cache_store
from .client import get_client

_cache: dict = {}
_lock = threading.Lock()

#: Bump when what we hand to XLA changes meaning for the same StableHLO.
COMPILE_OPTIONS_VERSION = "1"


class Executable:
    """A loaded PJRT executable taking and returning flat lists of buffers."""

    def __init__(self, loaded, key: str, serialized: bytes | None = None, compiled_here=True):
        self.loaded = loaded
        self.key = key
        self._serialized = serialized
        self._compiled_here = compiled_here
        self._result_handlers = None  # built from the first call's results

    def serialize(self) -> bytes:
        """The executable's bytes, for the disk cache and AOT artifacts.

        PJRT CPU cannot re-serialize an executable that was itself deserialized (the blob
        loads, then fails with "Function ... not found"), so such executables keep the bytes
        they came from.
        """
        if self._serialized is None:
            if not self._compiled_here:
                raise RuntimeError(f"executable {self.key[:16]} has no stored bytes")
            self._serialized = self.loaded.serialize()
        return self._serialized

    def run(self, buffers: list) -> list:
        results = self.loaded.execute_sharded(buffers)
        handlers = self._result_handlers
        if handlers is not None:
            return results.consume_with_handlers(handlers)
        outputs = [per_device[0] for per_device in results.disassemble_into_single_device_arrays()]
        self._result_handlers = _result_handlers_like(outputs)
        return outputs


def _result_handlers_like(outputs: list):
    """jaxlib's native result handlers for outputs shaped like ``outputs``, or None.

    Wrapping results through them costs a few microseconds a call; disassembling builds each
    Array in Python and costs about ten times that, which eager ops pay once per op. An
    executable's outputs keep their shapes, dtypes and device, so the first call's results tell
    what the handlers must make.
    """
    try:
        from jax._src import core
        return [_jax.array_result_handler(core.ShapedArray(out.shape, out.dtype), out.sharding,
                                          committed=True, _skip_checks=True)
                for out in outputs]
    except Exception as exc:  # another jaxlib: the slower path still gives the same arrays
        log.debug("torchtpu: no native result handlers (%s); disassembling results", exc)
        return None


def cache_key(fingerprint: str, precision: str, replicas: tuple = ()) -> str:
    """The cache key: program fingerprint, platform (and its version), options, precision and,
    for a multi-device program, the devices it is compiled for."""
    client = get_client()
    import jaxlib
    parts = (fingerprint, client.platform, client.pjrt.platform_version,
             f"jaxlib-{jaxlib.__version__}", COMPILE_OPTIONS_VERSION, precision)
    if replicas:
        parts += ("replicas=" + ",".join(map(str, replicas)),)
    return "|".join(parts)


def _placement(client, replicas: tuple):
    """(device list, compile options) for the devices a program runs on.

    ``replicas``: device ids, one replica each, for programs whose collectives span processes
    (tpu_dist); empty for the usual one-device program.
    """
    if not replicas:
        return client.device_list, _jax.CompileOptions()
    import numpy as np
    by_id = {d.id: d for d in client.pjrt.devices()}
    options = _jax.CompileOptions()
    options.num_replicas = len(replicas)
    options.num_partitions = 1
    options.device_assignment = _jax.DeviceAssignment.create(
        np.array([[i] for i in replicas]))
    return _jax.DeviceList(tuple(by_id[i] for i in replicas)), options


def _stores() -> list:
    """The persistent levels configured now (built once per configuration)."""
    return cache_store.configured_stores()


def _load_from(store, key: str, client, placement):
    """(loaded executable, its serialized payload, the framed entry) or Nones. An entry that
    cannot be read, is damaged or is not to be trusted is a miss at this level (counted, with
    one warning per store: ``cache.fetch``); a damaged one is discarded."""
    found = cache_store.fetch(store, key, "executable")
    if not isinstance(found, tuple):
        if found in ("corrupt", "untrusted"):
            counters.add_level(store.level, found)
        counters.add_level(store.level, "misses")
        return None, None, None
    blob, payload, meta = found
    try:
        loaded = client.pjrt.deserialize_executable(payload, *placement)
    except Exception as exc:
        cache_store.reject(store, key, "executable", f"it does not deserialize: {exc}")
        counters.add_level(store.level, "corrupt")
        counters.add_level(store.level, "misses")
        return None, None, None
    counters.add_level(store.level, "hits")
    counters.add_level(store.level, "bytes_read", len(blob))
    counters.add_level(store.level, "seconds_saved", float(meta.get("compile_seconds", 0.0)))
    return loaded, payload, blob


def compile_stablehlo(bytecode: bytes, fingerprint: str, precision: str,
                      what: str = "graph", replicas: tuple = ()) -> Executable:
    """Compile (or fetch from the cache) a StableHLO module given as MLIR bytecode (or text).

    ``fingerprint`` identifies the program with location info stripped; ``what`` names it in
    errors and logs; ``replicas`` (device ids) places a program with cross-device collectives
    on those devices, one replica each (module doc).
    """
    key = cache_key(fingerprint, precision, replicas)
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        counters.add("cache_hits")
        counters.add_level("process", "hits")
        return hit
    counters.add_level("process", "misses")
    client = get_client()
    placement = _placement(client, replicas)
    stores = _stores()
    exe = None
    for depth, store in enumerate(stores):
        loaded, payload, blob = _load_from(store, key, client, placement)
        if loaded is not None:
            for upper in stores[:depth]:  # fill the faster levels
                if cache_store.store_entry(upper, key, blob, "executable"):
                    counters.add_level(upper.level, "bytes_written", len(blob))
            exe = Executable(loaded, key, serialized=payload, compiled_here=False)
            counters.add("cache_hits")
            break
    if exe is None:
        counters.add("cache_misses")
        exe = _compile(bytecode, what, client, key, stores, placement)
    with _lock:
        return _cache.setdefault(key, exe)


def _compile(bytecode: bytes, what: str, client, key: str, stores: list, placement):
    start = time.perf_counter()
    try:
        loaded = client.pjrt.compile_and_load(bytecode, *placement)
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LoweringError(f"XLA could not compile {what}: {first_line}") from exc
    seconds = time.perf_counter() - start
    counters.add("graphs_compiled")
    counters.add("xla_compile_seconds", seconds)
    log.debug("compiled %s in %.3fs (key %s)", what, seconds, key[:16])
    exe = Executable(loaded, key)
    if stores:
        try:
            blob = cache_store.pack(exe.serialize(), key, compile_seconds=seconds, what=what)
        except Exception as exc:  # some plugins cannot serialize: the cache is an optimization
            log.debug("executable of %s not serializable: %s", what, exc)
            return exe
        for store in stores:
            if cache_store.store_entry(store, key, blob, "executable"):
                counters.add_level(store.level, "bytes_written", len(blob))
    return exe


def clear_cache() -> None:
    """Forget every compiled executable of this process (level 1 only)."""
    with _lock:
        _cache.clear()
