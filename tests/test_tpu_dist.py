"""tpu_dist: torch.distributed on tpu tensors, two processes on loopback — the fast core.

One spawn of 2 workers (tests/dist_launch.py, with a deadline) runs every collective and its
error cases, DDP, DTensor on a tpu mesh and an FSDP2 step, each compared with values computed
on the host, then checks that a dead peer gives an error instead of a hang
(tests/dist_workers.py ``core``). The long runs (compiled DDP and FSDP2, a compiled graph with
a collective, FSDP2 on a transformer) are in tests/slow/test_tpu_dist_slow.py.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from dist_launch import check, free_port, launch


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


def test_unnamed_backend_is_gloo_for_cpu_and_tpu_dist_for_tpu():
    # PyTorch gives the detected accelerator's backend alone; tpu is always detected, so CPU
    # tensors would go through tpu_dist. One process (world 1) shows the mapping and both paths:
    # CPU tensors reach gloo untouched (nothing staged), tpu tensors are staged.
    _python("import torch, torch.distributed as dist, torchtpu_compile\n"
            f"dist.init_process_group(init_method='tcp://127.0.0.1:{free_port()}', rank=0, "
            "world_size=1)\n"
            "assert dist.get_backend_config() == 'cpu:gloo,tpu:tpu_dist', "
            "dist.get_backend_config()\n"
            "gloo = dist.group.WORLD._get_backend(torch.device('cpu'))\n"
            "assert type(gloo).__name__ == 'ProcessGroupGloo', type(gloo)\n"
            "staged = lambda: torchtpu_compile.stats()['tpu_dist']['host_staged_collectives']\n"
            "x = torch.arange(3.0); dist.all_reduce(x); assert torch.equal(x, torch.arange(3.0))\n"
            "assert staged() == 0, staged()\n"
            "y = torch.arange(3.0, device='tpu'); dist.all_reduce(y)\n"
            "assert torch.equal(y.cpu(), torch.arange(3.0)) and staged() == 1, staged()\n"
            "dist.destroy_process_group(); print('ok')")


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
    # collectives: all_reduce (5 ops, ints, views, async), broadcast, all_gather(+into
    # tensor), reduce_scatter(+tensor), all_to_all(+single, uneven), send/recv/isend/irecv,
    # barrier, CPU tensors on the same group, unknown ops and mismatched shapes give errors;
    # DDP eager = one process on the global batch; DTensor distribute / redistribute /
    # matmul; FSDP2 on an MLP (2 SGD steps: losses, parameters, storage freed after backward);
    # then rank 1 exits and rank 0's next all_reduce must raise (group timeout 15 s).
    results = launch("core", deadline=240)
    check(results, expect="core ok")
    assert "rank 0: error after" in results[0].output, results[0].output[-2000:]
