"""Compiling StableHLO with PJRT, behind the executable cache.

The executable cache is a ``Levels`` cache (``runtime/cache``: this process, the host disk
``config.cache_dir``, an optional remote ``config.remote_cache``) whose codec is PJRT's own
serialization: an entry is the executable's bytes, loaded back onto the devices the program runs
on (``ExecutableCodec``).

A program with collectives runs on several devices, one replica each (``replicas``: their
ids, in replica order); this process passes and gets the buffers of its own device only.

Example::

    exe = compile_stablehlo(bytecode, fingerprint="ab12...", precision="medium")
    outputs = exe.run([to_buffer(x)])      # list of PJRT buffers
"""
from __future__ import annotations

import dataclasses
import time

from jaxlib import _jax

from .. import config, counters
from .._logging import log
from ..errors import LoweringError, raise_if_out_of_memory
from ..profiling import TORCH_PROFILER, executed, reentered, spanning
from . import memory
from .cache import Levels
from .client import get_client

#: Bump when what we hand to XLA changes meaning for the same StableHLO.
COMPILE_OPTIONS_VERSION = "1"


class Executable:
    """A loaded PJRT executable taking and returning flat lists of buffers."""

    def __init__(self, loaded, key: str = "", serialized: bytes | None = None,
                 compiled_here=True):
        self.loaded = loaded
        self.key = key
        self._serialized = serialized
        self._compiled_here = compiled_here
        self._result_handlers = None  # built from the first call's results
        self._output_bytes = None     # their sizes, for the memory figures (memory.py)
        self.donated = ()             # input positions donated to outputs (donation.py)
        self.name = "a program"       # what errors call it (compile_stablehlo's ``what``)

    def serialize(self) -> bytes:
        """The executable's bytes, for the disk cache and AOT artifacts.

        PJRT CPU cannot re-serialize an executable that was itself deserialized (the blob
        loads, then fails with "Function ... not found"), so such executables keep the bytes
        they came from.
        """
        if self._serialized is None:
            if not self._compiled_here:
                raise RuntimeError(f"executable {self.key[:16] or '(loaded)'} has no stored "
                                   f"bytes")
            self._serialized = self.loaded.serialize()
        return self._serialized

    def run(self, buffers: list) -> list:
        if TORCH_PROFILER._is_profiler_enabled and not reentered():
            return executed(self.run, buffers)  # a span to completion (profiling.py)
        try:
            results = self.loaded.execute_sharded(buffers)
        except _jax.JaxRuntimeError as exc:
            raise_if_out_of_memory(exc, f"running {self.name}")
            raise
        if self.donated:  # their memory is the outputs' now: counted once, not twice
            memory.donated([buffers[i] for i in self.donated])
        handlers = self._result_handlers
        if handlers is not None:
            return memory.track(results.consume_with_handlers(handlers), self._output_bytes)
        outputs = [per_device[0] for per_device in results.disassemble_into_single_device_arrays()]
        self._result_handlers = _result_handlers_like(outputs)
        self._output_bytes = [out.nbytes for out in outputs]
        return memory.track(outputs, self._output_bytes)


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


def xla_options(client) -> tuple:
    """XLA options set per compile, as (name, value) pairs: what ``config.excess_precision``
    asks of XLA where it differs from XLA's default, and on the CPU client its elemental
    fusion emitters (below). Part of the cache key and of an AOT artifact's executable tag.

    Eager PyTorch rounds every bf16/f16 op's result; XLA by default drops a float32 -> bf16
    -> float32 round trip between ops, so ``torch.matmul(a, b).float()`` of bf16 tensors
    returned 1.04736 where eager returns 1.046875 (fuzz seed 1654). "auto" keeps XLA's
    default on TPU only, where half-width math is the point and is not yet measured.

    Example::

        xla_options(get_client())
        # (("xla_allow_excess_precision", False), ("xla_cpu_use_fusion_emitters", False)) on CPU
    """
    options = ()
    mode = config.excess_precision
    if mode == "auto" and "--xla_allow_excess_precision" not in client.compile_flags:
        mode = "on" if client.platform == "tpu" else "off"  # else the user's XLA_FLAGS decide
    if mode == "off":
        options += (("xla_allow_excess_precision", False),)
    # XLA CPU's elemental fusion emitters run small programs' many little fusions faster than
    # its newer MLIR ones (measured 2026-12-05: a tiny Llama decode step's execute 99 -> 90 us,
    # the eager device's 100-op chain 1.97 -> 1.89 ms, GPT-2's SGD step 82.8 -> 79.3 ms, the
    # MLP and GPT-2 forward unchanged). The user's XLA_FLAGS decide where they name it.
    if client.platform == "cpu" and "--xla_cpu_use_fusion_emitters" not in client.compile_flags:
        options += (("xla_cpu_use_fusion_emitters", False),)
    return options


def xla_options_text(client) -> str:
    """``xla_options`` as the cache key and an artifact's tag write them ("" for none)."""
    return ",".join(f"{k}={v}" for k, v in xla_options(client))


def cache_key(fingerprint: str, precision: str, replicas: tuple = ()) -> str:
    """The cache key: program fingerprint, platform (and its version), options (ours and
    ``xla_options``), precision, the XLA flags of this process (``client.compile_flags``) and,
    for a multi-device program, the devices it is compiled for."""
    client = get_client()
    import jaxlib
    parts = (fingerprint, client.platform, client.pjrt.platform_version,
             f"jaxlib-{jaxlib.__version__}", COMPILE_OPTIONS_VERSION, precision)
    if client.compile_flags:
        parts += ("xla-flags=" + client.compile_flags,)
    options = xla_options_text(client)
    if options:
        parts += ("xla-options=" + options,)
    if replicas:
        parts += ("replicas=" + ",".join(map(str, replicas)),)
    return "|".join(parts)


def _placement(client, replicas: tuple):
    """(device list, compile options) for the devices a program runs on.

    ``replicas``: device ids, one replica each, for programs whose collectives span processes
    (tpu_dist); empty for the usual one-device program.
    """
    options = _jax.CompileOptions()
    options.env_option_overrides = list(xla_options(client))
    if not replicas:
        return client.device_list, options
    import numpy as np
    by_id = {d.id: d for d in client.pjrt.devices()}
    options.num_replicas = len(replicas)
    options.num_partitions = 1
    options.device_assignment = _jax.DeviceAssignment.create(
        np.array([[i] for i in replicas]))
    return _jax.DeviceList(tuple(by_id[i] for i in replicas)), options


@dataclasses.dataclass(frozen=True)
class ExecutableCodec:
    """PJRT's serialization: an executable to its bytes, and bytes to an executable loaded on
    the devices it runs on (``replicas``: device ids, one replica each; empty: the one device
    of the usual program). Bytes that do not deserialize raise (the levels discard them).

    Example::

        exe = ExecutableCodec(replicas=(0, 1)).decode(payload)
    """

    replicas: tuple = ()

    def encode(self, exe: Executable) -> bytes:
        return exe.serialize()

    def decode(self, payload: bytes) -> Executable:
        client = get_client()
        loaded = client.pjrt.deserialize_executable(payload, *_placement(client, self.replicas))
        return Executable(loaded, serialized=payload, compiled_here=False)


_levels = Levels("executable", ExecutableCodec(), kept="process_cache_programs")


def compile_stablehlo(bytecode: bytes, fingerprint: str, precision: str,
                      what: str = "graph", replicas: tuple = (), donate: dict | None = None
                      ) -> Executable:
    """Compile (or fetch from the cache) a StableHLO module given as MLIR bytecode (or text).

    ``fingerprint`` identifies the program with location info stripped; ``what`` names it in
    errors and logs; ``replicas`` (device ids) places a program with cross-device collectives
    on those devices, one replica each (module doc); ``donate`` ({input: output}): inputs
    whose buffers the program reuses for those outputs (``donation.py``), part of the key.
    """
    key = cache_key(fingerprint, precision, replicas)
    if donate:
        from .donation import donation_key, with_aliasing
        key += "|" + donation_key(donate)
    codec = ExecutableCodec(tuple(replicas)) if replicas else None  # None: one device
    exe = _levels.get(key, codec)
    if exe is None:
        if donate:
            bytecode = with_aliasing(bytecode, donate)
        exe, seconds = _compile(bytecode, what, key, replicas)
        _levels.put(key, exe, compute_seconds=seconds, codec=codec)
    if donate:
        exe.donated = tuple(sorted(donate))
    exe.name = what
    return exe


def _compile(bytecode: bytes, what: str, key: str, replicas: tuple) -> tuple[Executable, float]:
    client = get_client()
    start = time.perf_counter()
    try:
        with spanning("torchtpu::xla_compile", program=what):
            loaded = client.pjrt.compile_and_load(bytecode, *_placement(client, replicas))
    except Exception as exc:
        # on TPU a program whose buffers do not fit in HBM fails here, not when run
        raise_if_out_of_memory(exc, f"compiling {what}")
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LoweringError(f"XLA could not compile {what}: {first_line}") from exc
    seconds = time.perf_counter() - start
    counters.add("graphs_compiled")
    counters.add("xla_compile_seconds", seconds)
    log.debug("compiled %s in %.3fs (key %s)", what, seconds, key[:16])
    return Executable(loaded, key), seconds


def clear_cache() -> None:
    """Forget every compiled executable of this process (level 1 only)."""
    _levels.clear_memory()
