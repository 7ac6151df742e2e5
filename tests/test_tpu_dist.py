"""tpu_dist: torch.distributed on tpu tensors, two processes on loopback — the fast core.

One spawn of 2 workers (tests/support/dist_launch.py, with a deadline), on the group that
``init_process_group()`` makes with no backend named ("cpu:gloo,tpu:tpu_dist"), runs every
collective on the PJRT transport and on a host-staged group, and the error cases, a compiled
graph with its collectives lowered into the program, DDP, DTensor on a tpu mesh and FSDP2
steps, each compared with values computed on the host, then checks that a dead peer gives an
error instead of a hang (tests/support/dist_workers.py ``core``). The long runs (compiled DDP and
FSDP2, FSDP2 on a transformer, a client made before init_process_group) are in
tests/slow/test_tpu_dist_slow.py.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.support.dist_launch import check, launch


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
    with pytest.raises(TypeError, match="AVG with boolean inputs"):  # as NCCL (was all False)
        resolve(dist.ReduceOp.AVG, torch.bool)
    with pytest.raises(ValueError, match="reduce op premul_sum is not supported"):  # not <obj>
        resolve(dist._make_nccl_premul_sum(2.0), torch.float32)


def test_collectives_ddp_dtensor_fsdp2_and_a_dead_peer_on_two_processes():
    # the unnamed backend is "cpu:gloo,tpu:tpu_dist", and CPU tensors are not staged;
    # collectives: all_reduce (5 ops, ints, bf16, views, async), broadcast, all_gather(+into
    # tensor), reduce_scatter(+tensor), all_to_all(+single), reduce, barrier on PJRT; uneven
    # all_to_all_single and send/recv/isend/irecv host-staged and counted; CPU tensors on the
    # same group, unknown ops and mismatched shapes give errors; a compiled graph with five
    # functional collectives lowered into its program;
    # DDP eager = one process on the global batch; DTensor distribute / redistribute /
    # matmul; FSDP2 on an MLP (2 SGD steps: losses, parameters, storage freed after backward);
    # then rank 1 dies while rank 0 waits in an all_reduce (group timeout 15 s): that one and
    # the next raise DistBackendError naming rank 1.
    # Every collective PJRT carries runs on it (nothing staged) and equals the result of a
    # host-staged group (TORCHTPU_DIST_TRANSPORT=staged); the dead peer is found by the PJRT
    # transport itself in flight (the signature check is off for that call), and by rank 1's
    # closed lifeline before the next one starts.
    results = launch("core", deadline=240)
    check(results, expect="core ok")
    assert "in flight: error" in results[0].output and "on the pjrt transport" in \
        results[0].output and "next: error" in results[0].output, results[0].output[-2000:]


def test_ranks_agree_to_stage_when_one_client_exists_already():
    # The decision of pjrt_world, on one process: this test process's PJRT client exists
    # (other tests made it), so whatever rank 1 says, the group is host-staged, on every
    # rank, and the reason names the fix. (tests/slow: the same with two real processes.)
    import datetime
    import torch.distributed as dist
    from torchtpu_compile.runtime.client import get_client
    from torchtpu_eager.distributed import pjrt_world
    get_client()
    store = dist.HashStore()
    store.set("tpu_dist_pjrt/able/1", "yes")
    devices, why = pjrt_world.placement(store, 0, 2, datetime.timedelta(seconds=10))
    assert devices is None and "before init_process_group" in why, why
    assert store.get("tpu_dist_pjrt/coordinator").decode().startswith("staged:rank 0")
    assert not pjrt_world._world, "nothing joined"


def test_coordinator_tells_the_others_which_rank_ended_and_how():
    # One process plays three ranks' lifelines (tests/slow: real ranks killed). Rank 1 is a
    # process SIGKILLed (no goodbye: "died"), rank 2 says goodbye and leaves ("exited"); rank
    # 0 hears both; when the last lifeline closes, the coordinator process exits by itself.
    import signal
    import socket
    import time
    from torchtpu_eager.distributed.coordinator import Lifeline, start
    _, port, coordinator = start(num_processes=3, timeout=60, heartbeat_timeout=10,
                                 shutdown_timeout=10)
    try:
        ranks = {0: Lifeline("127.0.0.1", port, rank=0), 2: Lifeline("127.0.0.1", port, rank=2)}
        killed = subprocess.Popen(
            [sys.executable, "-c", "import socket, sys, time; "
             f"s = socket.create_connection(('127.0.0.1', {port})); s.sendall(b'rank 1\\n'); "
             "print('up', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
        assert killed.stdout.readline().strip() == "up"
        assert ranks[0].gone() == {}
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        ranks[2].goodbye()
        ranks[2]._socket.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + 30
        while ranks[0].gone() != {1: "died", 2: "exited"} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ranks[0].gone() == {1: "died", 2: "exited"}, ranks[0].gone()
        assert coordinator.poll() is None, "rank 0 still holds its lifeline"
        ranks[0]._socket.shutdown(socket.SHUT_RDWR)
        assert coordinator.wait(timeout=30) == 0
    finally:
        if coordinator.poll() is None:
            coordinator.kill()


def test_fsdp2_on_a_shard_dim_of_one_trains_as_on_the_cpu():
    # FSDP2's world-size-1 path re-allocates unsharded parameters through the name its param
    # group imported, which the tpu hook never reached: "storage was freed" in the first
    # backward (a 1-process run, an HSDP mesh of (2, 1)).
    code = """
import os, socket, torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
torch.set_float32_matmul_precision("highest")
with socket.socket() as s:
    s.bind(("localhost", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(port))
dist.init_process_group("cpu:gloo,tpu:tpu_dist", rank=0, world_size=1)
g = torch.Generator().manual_seed(1)
x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
results = {}
for dev in ("cpu", "tpu"):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    mesh = init_device_mesh(dev, (1,))
    fully_shard(m[0], mesh=mesh); fully_shard(m, mesh=mesh)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    losses = []
    for _ in range(2):
        loss = F.mse_loss(m(x.to(dev)), y.to(dev)); loss.backward(); opt.step(); opt.zero_grad()
        losses.append(loss.item())
    results[dev] = losses, m[0].weight.full_tensor().detach().cpu()
torch.testing.assert_close(results["tpu"][0], results["cpu"][0], rtol=1e-5, atol=1e-6)
torch.testing.assert_close(results["tpu"][1], results["cpu"][1], rtol=1e-5, atol=1e-6)
dist.destroy_process_group()
print("ok")
"""
    _python(code)
