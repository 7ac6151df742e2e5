"""The one lowering: a functional ATen FX graph -> StableHLO bytecode (via torch-mlir).

Eager ops, fused eager groups, compiled graphs and AOT exports all come through here.

``lower_graph`` and ``LoweredModule`` are loaded on first use: modules of this package that
need no torch-mlir (``index_checks``, ``collectives``, ...) are imported by the AOT loader's
run path, which must start without importing torch-mlir.

Example::

    from torchtpu_compile.lower import lower_graph
    lowered = lower_graph(gm, platform="cpu", precision="highest")
"""
from __future__ import annotations

import importlib

__all__ = ["LoweredModule", "lower_graph"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module(".importer", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
