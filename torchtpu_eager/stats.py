"""The eager device's counters, reported by ``torchtpu_compile.stats()`` at its top level.

Registered when the device registers itself (``device.register``); light, as that runs at
``import torch``. Ops that fall back to the host are also counted per op in ``fallback_ops``,
with the compile path's (``torchtpu_compile.fallback_policy``).

Example::

    from torchtpu_eager.stats import COUNTERS
    COUNTERS.add("fused_graphs_run")
    torchtpu_compile.stats()["fused_graphs_run"]
"""
from torchtpu_compile import counters

COUNTERS = counters.register("eager", lambda: {
    "eager_programs_compiled": 0,    # single-op and fused programs built
    "eager_traces": 0,               # op signatures (and view reads...) traced: make_fx runs
    "eager_fallbacks": 0,            # ops run on the host because they do not lower
    "fused_graphs_run": 0,           # defer-and-fuse: deferred graphs executed
    "fused_graph_cache_hits": 0,     # ... of which had been compiled before
    "fused_recordings_op_by_op": 0,  # defer-and-fuse: recordings run op by op (not yet
                                     # seen config.fuse_compile_at times)
})
