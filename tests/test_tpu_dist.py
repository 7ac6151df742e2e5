"""tpu_dist: torch.distributed on tpu tensors, two processes on loopback.

Each multi-process test starts a group (tests/dist_launch.py) with a deadline; the workers
(tests/dist_workers.py) compare their results with values computed on the host. Compiled DDP
and FSDP2 are in tests/slow/test_tpu_dist_slow.py.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from dist_launch import check, launch


def test_registered_at_import_without_jax():
    code = ("import sys, torch, torch.distributed as dist; "
            "assert dist.Backend.default_device_backend_map['tpu'] == 'tpu_dist'; "
            "assert 'tpu' in dist.Backend.backend_capability['tpu_dist']; "
            "assert 'jax' not in sys.modules and 'torchtpu_eager.distributed.process_group' "
            "not in sys.modules, 'registration must stay light'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_reduce_op_errors_name_the_supported_ops():
    import torch.distributed as dist
    from torchtpu_eager.distributed.reduce_ops import resolve
    assert resolve(dist.ReduceOp.AVG, torch.float32) == (dist.ReduceOp.SUM, True)
    assert resolve("max", torch.float32) == (dist.ReduceOp.MAX, False)
    with pytest.raises(ValueError, match="sum, avg, max, min, product"):
        resolve("median", torch.float32)
    with pytest.raises(ValueError, match="integer"):
        resolve(dist.ReduceOp.BXOR, torch.float32)


def test_every_collective_matches_host_values():
    # all_reduce (5 ops, ints, views, async), broadcast, all_gather(+into tensor),
    # reduce_scatter(+tensor), all_to_all(+single, uneven), send/recv/isend/irecv, barrier,
    # CPU tensors on the same group; then unknown ops and mismatched shapes give errors.
    check(launch("collectives", deadline=180))


def test_ddp_eager_matches_single_process_on_global_batch():
    check(launch("ddp_eager", deadline=180))


def test_compiled_graph_with_collective():
    check(launch("compiled_collective", deadline=150))


def test_dead_rank_errors_instead_of_hanging():
    # rank 1 exits after a first all_reduce; rank 0's next one must raise, well within the
    # group's 15 s timeout (the worker asserts < 40 s and prints how long it took)
    results = launch("dead_rank", deadline=120)
    check(results, expect="")
    assert "rank 0: error after" in results[0].output, results[0].output[-2000:]
