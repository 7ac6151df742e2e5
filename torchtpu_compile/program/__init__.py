"""The core: the one program builder and the one run path, shared by every front end.

A graph becomes a runnable program through one function, whatever the front end::

    FX graph ─ build.build_program ─► normalize ─► collective plan ─► support analysis
             ─► calling convention ─► lowering (one lowering cache) ─► compile (one executable
             cache) ─► run.Program: buffers in ─► executable ─► output slots ─► outputs

- ``run.py``: ``Program``, the run path (buffer level for the eager device and tpu_dist, tensor
  level for compiled graphs and AOT artifacts), and ``compile_program``, the compile half
  (StableHLO -> Program) for callers that have StableHLO, not a graph (tpu_dist's collectives;
  the AOT loader wraps its stored executable in a ``Program`` directly). Light: no lowering.
- ``build.py``: ``build_program`` (and ``lower_program``, its lower half), with the fallback
  policy applied where ops cannot go through XLA (``PartitionedProgram``).
- ``memory_split.py``: where a backward graph is cut so that its saved inputs die between its
  pieces (also a ``PartitionedProgram``); ``donation.py``: inputs a program overwrites.
- ``runner.py``: ``GraphRunner``, what the compile path hands aot_autograd per graph: one
  program per precision and shape (or per bucket, ``buckets/``).

Example::

    from torchtpu_compile.program import build_program
    program = build_program(gm, precision="highest", name="forward")
    outputs = program([x, weight])

Names are loaded on first use: the AOT loader imports ``run`` without the lowering.
"""
import importlib

_EXPORTS = {"Program": "run", "compile_program": "run", "build_program": "build",
            "lower_program": "build", "PartitionedProgram": "build", "GraphRunner": "runner",
            "specialize": "runner"}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
