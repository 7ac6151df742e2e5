"""tpu_dist's counters, reported by ``torchtpu_compile.stats()["tpu_dist"]``.

pjrt_*: collectives run as StableHLO collectives by the multi-process PJRT client;
host_staged_*: through host memory and gloo; host_staged_groups: groups whose client could not
be joined (every collective of theirs is staged); functional_collectives: functional
collectives run through a group. (The compile path reports its own two there: collectives a
compiled graph is cut at, and collectives lowered inside compiled programs.)

Registered with the backend (``register``), at ``import torch``: it imports nothing heavy.

Example::

    from torchtpu_eager.distributed.stats import COUNTERS
    COUNTERS.add("host_staged_bytes", 4096)
"""
from torchtpu_compile import counters

COUNTERS = counters.register("tpu_dist", lambda: {
    "collectives": 0, "pjrt_collectives": 0, "pjrt_bytes": 0,
    "host_staged_collectives": 0, "host_staged_bytes": 0, "host_staged_groups": 0,
    "functional_collectives": 0,
}, under="tpu_dist")
