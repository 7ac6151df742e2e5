"""Compiling StableHLO with PJRT, behind the process-level compile cache.

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
from .client import get_client

_cache: dict = {}
_lock = threading.Lock()

#: Bump when what we hand to XLA changes meaning for the same StableHLO.
COMPILE_OPTIONS_VERSION = "1"


class Executable:
    """A loaded PJRT executable taking and returning flat lists of buffers."""

    def __init__(self, loaded, key: str):
        self.loaded = loaded
        self.key = key

    def run(self, buffers: list) -> list:
        results = self.loaded.execute_sharded(buffers)
        return [per_device[0] for per_device in results.disassemble_into_single_device_arrays()]


def cache_key(fingerprint: str, precision: str) -> str:
    """The cache key: program fingerprint, platform (and its version), options and precision."""
    client = get_client()
    return "|".join((fingerprint, client.platform, client.pjrt.platform_version,
                     COMPILE_OPTIONS_VERSION, precision))


def compile_stablehlo(bytecode: bytes, fingerprint: str, precision: str,
                      what: str = "graph") -> Executable:
    """Compile (or fetch from the cache) a StableHLO module given as MLIR bytecode.

    ``fingerprint`` identifies the program with location info stripped; ``what`` names it in
    errors and logs.
    """
    key = cache_key(fingerprint, precision)
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        counters.add("cache_hits")
        return hit
    counters.add("cache_misses")
    client = get_client()
    start = time.perf_counter()
    try:
        loaded = client.pjrt.compile_and_load(bytecode, client.device_list, _jax.CompileOptions())
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LoweringError(f"XLA could not compile {what}: {first_line}") from exc
    seconds = time.perf_counter() - start
    counters.add("graphs_compiled")
    counters.add("xla_compile_seconds", seconds)
    log.debug("compiled %s in %.3fs (key %s)", what, seconds, key[:16])
    exe = Executable(loaded, key)
    with _lock:
        _cache.setdefault(key, exe)
    return exe


def clear_cache() -> None:
    """Forget every compiled executable of this process."""
    with _lock:
        _cache.clear()
