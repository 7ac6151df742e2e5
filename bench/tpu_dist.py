"""tpu_dist on 2 processes: all_reduce bus bandwidth against gloo, DDP and FSDP2 step time
against one process.

Both ranks run in one group ``"cpu:gloo,tpu:tpu_dist"``; each size is timed three ways,
alternately in the same run, median of the rounds: tpu tensors on the PJRT transport (the
group's, a StableHLO all-reduce run by the joined PJRT clients), tpu tensors host-staged (a
second group made under ``TORCHTPU_DIST_TRANSPORT=staged``), and CPU tensors on gloo. Bus
bandwidth is the NCCL-tests convention: 2 (n-1)/n * bytes / time. The DDP row is one
training step of an MLP on a global batch of 64, split over 2 processes, against the
same step in one process on the whole batch (rank 0 times it after the group's runs). The
FSDP2 row is the same for the MLP with each layer and the root ``fully_shard``-ed on a
``init_device_mesh("tpu", (2,))`` mesh (all-gather before each layer's forward and
backward, reduce-scatter of its gradients), against the unsharded step in one process.

Usage::

    .venv/bin/python bench/tpu_dist.py            # prints the table
    .venv/bin/python bench/run_all.py --only tpu_dist
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES_MB = (1, 4, 16, 64)


def _worker(rank: int, port: int, quick: bool) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)  # two processes share two cores
    dist.init_process_group("cpu:gloo,tpu:tpu_dist", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120))
    from torchtpu_compile import config
    with config.patch(dist_transport="staged"):
        staged = dist.new_group()
    rounds = 3 if quick else 7
    out = {"allreduce": {}, "ddp": {}}
    for mb in SIZES_MB:
        n = mb * 2**20 // 4
        host = torch.ones(n)
        dev = host.to("tpu")
        times = {"pjrt": [], "staged": [], "gloo": []}
        for _ in range(rounds + 1):  # first round: warm-up
            for name, t, group in (("pjrt", dev, None), ("staged", dev, staged),
                                   ("gloo", host, None)):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(t, group=group)
                if name != "gloo":
                    torch.tpu.synchronize()
                times[name].append(time.perf_counter() - start)
        out["allreduce"][mb] = {k: statistics.median(v[1:]) for k, v in times.items()}

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                   torch.nn.Linear(512, 256)).to("tpu")

    x, y = torch.randn(64, 256), torch.randn(64, 256)

    def step_fn(net, xb, yb):
        opt = torch.optim.SGD(net.parameters(), lr=0.01)

        def step():
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(xb), yb).backward()
            opt.step()
            torch.tpu.synchronize()
        return step

    def timed(step, together=True):
        samples = []
        for _ in range(rounds + 2):  # first two: warm-up (compiles)
            if together:
                dist.barrier()
            start = time.perf_counter()
            step()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples[2:])

    local = x[rank * 32:(rank + 1) * 32].to("tpu"), y[rank * 32:(rank + 1) * 32].to("tpu")
    out["ddp"]["two_processes"] = timed(step_fn(DDP(model()), *local))
    out["fsdp"] = {"two_processes": timed(step_fn(_fully_sharded(model()), *local))}
    dist.barrier()
    if rank == 0:
        single = timed(step_fn(model(), x.to("tpu"), y.to("tpu")), together=False)
        out["ddp"]["one_process"] = out["fsdp"]["one_process"] = single
        import torchtpu_compile
        out["stats"] = torchtpu_compile.stats()["tpu_dist"]
        print("RESULT " + json.dumps(out), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _fully_sharded(net):
    """``net`` with each Linear and the root sharded by FSDP2 over both processes."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("tpu", (2,))
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(net, mesh=mesh)


def measure(quick: bool = False, deadline: float = 600.0) -> dict:
    """Run the two workers; rank 0's measurements."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(rank), str(port)]
                              + (["--quick"] if quick else []),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(2)]
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=deadline)[0])
        except subprocess.TimeoutExpired:
            proc.kill()
            outputs.append(proc.communicate()[0])
    for line in outputs[0].splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError("tpu_dist benchmark workers failed:\n" + "\n".join(
        o[-2000:] for o in outputs))


def _busbw(mb: int, seconds: float, world: int = 2) -> float:
    return 2 * (world - 1) / world * mb * 2**20 / seconds / 1e9


def bench_tpu_dist(quick: bool) -> list[dict]:
    """Rows for run_all: all_reduce per size (eager column: gloo on CPU tensors; torchtpu:
    the PJRT transport; host-staged in the note), DDP and FSDP2 steps."""
    from common import result
    data = measure(quick)
    rows = []
    for mb, t in data["allreduce"].items():
        rows.append(result(
            f"all_reduce {mb} MB, 2 procs", {"eager": t["gloo"], "torchtpu": t["pjrt"]},
            notes=[f"bus bandwidth {mb} MB: tpu_dist PJRT {_busbw(int(mb), t['pjrt']):.2f} GB/s, "
                   f"tpu_dist host-staged {_busbw(int(mb), t['staged']):.2f} GB/s, "
                   f"gloo on CPU tensors {_busbw(int(mb), t['gloo']):.2f} GB/s "
                   f"(eager column: gloo; torchtpu column: the PJRT transport)"]))
    ddp, fsdp = data["ddp"], data["fsdp"]
    rows.append(result(
        "DDP MLP step, 2 procs vs 1", {"eager": ddp["one_process"],
                                       "torchtpu": ddp["two_processes"]},
        notes=["DDP row: eager column is the same step on tpu in one process on the global "
               "batch; torchtpu column is DDP on 2 processes (half the batch each)"]))
    rows.append(result(
        "FSDP2 MLP step, 2 procs vs 1", {"eager": fsdp["one_process"],
                                         "torchtpu": fsdp["two_processes"]},
        notes=["FSDP2 row: eager column as for DDP; torchtpu column is fully_shard on a tpu "
               "mesh of 2 processes (half the batch each)"]))
    return rows


BENCHMARKS = {"tpu_dist": bench_tpu_dist}


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(int(sys.argv[2]), int(sys.argv[3]), "--quick" in sys.argv)
    else:
        quick = "--quick" in sys.argv
        data = measure(quick)
        print(f"{'size':>6} {'PJRT':>10} {'staged':>10} {'gloo':>10}   bus GB/s: "
              f"{'PJRT':>6} {'staged':>6} {'gloo':>6}")
        for mb, t in data["allreduce"].items():
            print(f"{mb:>4}MB {t['pjrt'] * 1e3:>8.2f}ms {t['staged'] * 1e3:>8.2f}ms "
                  f"{t['gloo'] * 1e3:>8.2f}ms   {'':>9}" + " ".join(
                      f"{_busbw(int(mb), t[k]):>6.2f}" for k in ("pjrt", "staged", "gloo")))
        for name in ("ddp", "fsdp"):
            t = data[name]
            print(f"{name.upper()} step: 2 processes {t['two_processes'] * 1e3:.1f} ms, one "
                  f"process {t['one_process'] * 1e3:.1f} ms")
        print("stats:", data["stats"])
