"""The one lowering: a functional ATen FX graph -> StableHLO bytecode (via torch-mlir).

Eager ops, fused eager groups, compiled graphs and AOT exports all come through here.
"""
from .importer import LoweredModule, lower_graph

__all__ = ["LoweredModule", "lower_graph"]
