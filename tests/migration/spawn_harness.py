"""What the distributed migration scripts (ddp_train.py, fsdp2_train.py) share beyond the
tutorial: spawning the ranks, reading back the checkpoint and each rank's results, and the
command line tests/slow/test_migration_dist.py calls. The training itself stays in each script.

Example::

    from tests.migration import spawn_harness
    result = spawn_harness.run_spawned(worker, "tpu", world_size=2)
    result["ranks"][0]["losses"], result["checkpoint"]
"""
from __future__ import annotations

import os
import socket
import sys
import tempfile

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port free on this host now, for ``MASTER_PORT``."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def record_stats(path):
    """torchtpu's counters of this process (host fallbacks, collectives by transport), saved
    for the test to check that everything ran on the device."""
    import torchtpu_compile
    stats = torchtpu_compile.stats()
    torch.save({"fallback_ops": dict(stats["fallback_ops"]),
                "eager_fallbacks": stats["eager_fallbacks"], "tpu_dist": stats["tpu_dist"]},
               path)


def run_spawned(worker, device: str, world_size: int) -> dict:
    """Spawn ``world_size`` processes of ``worker(rank, world_size, port, device,
    checkpoint_dir, results_dir)``; return each rank's results (``rank{r}.pt``, with its
    ``stats{r}.pt`` when it wrote one) and the DCP checkpoint read back on the host."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    with tempfile.TemporaryDirectory() as work:
        checkpoint_dir = os.path.join(work, "checkpoint")
        mp.spawn(worker, args=(world_size, free_port(), device, checkpoint_dir, work),
                 nprocs=world_size, join=True)
        dcp_to_torch_save(checkpoint_dir, os.path.join(work, "checkpoint.pt"))
        checkpoint = torch.load(os.path.join(work, "checkpoint.pt"), weights_only=False)
        ranks = [torch.load(os.path.join(work, f"rank{r}.pt")) for r in range(world_size)]
        for r, rank in enumerate(ranks):
            stats = os.path.join(work, f"stats{r}.pt")
            rank["stats"] = torch.load(stats) if os.path.exists(stats) else None
    return {"ranks": ranks, "checkpoint": checkpoint}


def run_as_script(main) -> None:
    """``python -m tests.migration.<script> DEVICE [RESULTS.pt]``: run ``main(DEVICE)``, save
    its result where the test reads it, print the losses."""
    result = main(sys.argv[1])
    if len(sys.argv) > 2:
        torch.save(result, sys.argv[2])
    print({"losses": [r["losses"] for r in result["ranks"]]})
