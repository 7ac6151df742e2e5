"""tpu_dist: torch.distributed on tpu tensors, two processes on loopback — the fast core.

One spawn of 2 workers (tests/dist_launch.py, with a deadline), on the group that
``init_process_group()`` makes with no backend named ("cpu:gloo,tpu:tpu_dist"), runs every
collective and its error cases, DDP, DTensor on a tpu mesh and FSDP2 steps, each compared
with values computed on the host, then checks that a dead peer gives an error instead of a
hang (tests/dist_workers.py ``core``). The long runs (compiled DDP and FSDP2, a compiled graph with
a collective, FSDP2 on a transformer) are in tests/slow/test_tpu_dist_slow.py.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from dist_launch import check, launch


def _python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]
    return out.stdout


def test_registered_at_import_without_jax():
    _python("import sys, torch, torch.distributed as dist; "
            "assert dist.Backend.default_device_backend_map['tpu'] == 'tpu_dist'; "
            "assert 'tpu' in dist.Backend.backend_capability['tpu_dist']; "
            "assert 'jax' not in sys.modules and 'torchtpu_eager.distributed.process_group' "
            "not in sys.modules, 'registration must stay light'; print('ok')")


def test_reduce_op_errors_name_the_supported_ops():
    import torch.distributed as dist
    from torchtpu_eager.distributed.reduce_ops import resolve
    assert resolve(dist.ReduceOp.AVG, torch.float32) == (dist.ReduceOp.SUM, True)
    assert resolve("max", torch.float32) == (dist.ReduceOp.MAX, False)
    with pytest.raises(ValueError, match="sum, avg, max, min, product"):
        resolve("median", torch.float32)
    with pytest.raises(ValueError, match="integer"):
        resolve(dist.ReduceOp.BXOR, torch.float32)


def test_collectives_ddp_dtensor_fsdp2_and_a_dead_peer_on_two_processes():
    # the unnamed backend is "cpu:gloo,tpu:tpu_dist", and CPU tensors are not staged;
    # collectives: all_reduce (5 ops, ints, views, async), broadcast, all_gather(+into
    # tensor), reduce_scatter(+tensor), all_to_all(+single, uneven), send/recv/isend/irecv,
    # barrier, CPU tensors on the same group, unknown ops and mismatched shapes give errors;
    # DDP eager = one process on the global batch; DTensor distribute / redistribute /
    # matmul; FSDP2 on an MLP (2 SGD steps: losses, parameters, storage freed after backward);
    # then rank 1 exits and rank 0's next all_reduce must raise (group timeout 15 s).
    results = launch("core", deadline=240)
    check(results, expect="core ok")
    assert "rank 0: error after" in results[0].output, results[0].output[-2000:]
