"""The lowering cache: StableHLO by a key of the FX graph, so a warm process skips torch-mlir.

The key is the graph's generated code (ops, their order, literal arguments), the dtype and shape
of every value in it, the platform, the precision, the versions of the stack, the source of
``lower/`` and the StableHLO of every JAX function the graph calls (``jax_op``). The graph
handed to lowering is already in the program calling convention (tensor inputs only, constants
lifted to arguments), so nothing else reaches the StableHLO.

Example::

    lowered = lower_graph_cached(prepared.gm, platform="cpu", precision="medium")
"""
from __future__ import annotations

import hashlib
import json
import time

import torch
import torch.fx as fx

from .. import config, versions
from ..kernels.jax_op import graph_fingerprint
from ..profiling import spanning
from ..runtime.cache import GRAPH_FOLDER, Levels
from .importer import LoweredModule, lower_graph


def _value_spec(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype}{list(value.shape)}"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_value_spec(v) for v in value) + ")"
    return type(value).__name__ if value is not None else "-"


def graph_key(gm: fx.GraphModule, platform: str, precision: str) -> str:
    """The lowering-cache key of ``gm`` (see the module docstring for what it covers)."""
    digest = hashlib.sha256()
    digest.update(gm.code.encode())
    for node in gm.graph.nodes:
        digest.update(f"{node.name}:{_value_spec(node.meta.get('val'))};".encode())
    context = "|".join((platform, precision, config.compile_hash(), versions.stack_versions(),
                        versions.source_digest("lower"), graph_fingerprint(gm)))
    return f"lower|{digest.hexdigest()}|{context}"


def lower_graph_cached(gm: fx.GraphModule, platform: str, precision: str,
                       collectives=None) -> LoweredModule:
    """``lower_graph``, answered from the lowering cache when this graph was lowered before.

    ``collectives``: the graph's collective plan (``collective_graphs.plan_collectives``), made
    once by the program builder; None for a graph without collectives. A program with
    collectives is not cached: it depends on its group's size, which the key does not see. Off
    with ``config.graph_cache = False``. Failures are not cached: a graph that does not lower
    raises ``LoweringError`` each time, as ``lower_graph`` does.

    Example::

        lowered = lower_graph_cached(gm, platform="cpu", precision="highest")
    """
    if not config.graph_cache or collectives is not None:
        with spanning("torchtpu::lowering"):
            return lower_graph(gm, platform=platform, precision=precision,
                               collectives=collectives)
    key = graph_key(gm, platform, precision)
    cached = _levels.get(key)
    if cached is not None:
        return cached
    start = time.perf_counter()
    with spanning("torchtpu::lowering"):
        lowered = lower_graph(gm, platform=platform, precision=precision)
    _levels.put(key, lowered, compute_seconds=time.perf_counter() - start)
    return lowered


#: What MLIR bytecode starts with.
_BYTECODE_MAGIC = b"ML\xefR"


class LoweringCodec:
    """A lowered module as a little-endian header size, a JSON header (fingerprint, text) and
    the MLIR bytecode. ``decode`` raises where a payload is not one, or where its fingerprint
    is not its text's (the executable cache keys on the fingerprint).

    Example::

        codec = LoweringCodec()
        assert codec.decode(codec.encode(lowered)).fingerprint == lowered.fingerprint
    """

    def encode(self, lowered: LoweredModule) -> bytes:
        header = json.dumps({"fingerprint": lowered.fingerprint, "text": lowered.text}).encode()
        return len(header).to_bytes(4, "little") + header + lowered.bytecode

    def decode(self, payload: bytes) -> LoweredModule:
        header_size = int.from_bytes(payload[:4], "little")
        header = json.loads(payload[4:4 + header_size].decode("utf-8"))
        bytecode = payload[4 + header_size:]
        if not (isinstance(header, dict) and isinstance(header.get("text"), str)
                and isinstance(header.get("fingerprint"), str)):
            raise ValueError("header is not {fingerprint, text}")
        if hashlib.sha256(header["text"].encode()).hexdigest() != header["fingerprint"]:
            raise ValueError("fingerprint is not the StableHLO's")
        if not bytecode.startswith(_BYTECODE_MAGIC):
            raise ValueError("not MLIR bytecode")
        return LoweredModule(bytecode=bytecode, fingerprint=header["fingerprint"],
                             text=header["text"])


_levels = Levels("lowering", LoweringCodec(), folder=GRAPH_FOLDER)


def clear_memory() -> None:
    """Forget this process's lowering-cache entries (level 1 only)."""
    _levels.clear_memory()
