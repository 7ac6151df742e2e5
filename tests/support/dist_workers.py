"""Worker bodies for tests/test_tpu_dist.py:
``python -m tests.support.dist_workers CASE RANK WORLD PORT``.

Each case runs in one process of a group on loopback, checks its own results against values
computed on the host (every rank can compute what every other rank sent), and exits non-zero
on a mismatch. ``tests/test_tpu_dist.py`` starts the processes with a deadline.
"""
from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def init(rank, world, port, backend="tpu_dist", timeout=60):
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout))


def same(got, want, what, atol=1e-5):
    got = got.cpu() if isinstance(got, torch.Tensor) else got
    if not torch.allclose(got.to(want.dtype), want, atol=atol, rtol=1e-5):
        raise AssertionError(f"{what}: got {got} want {want}")


def data(rank, shape=(4, 3), dtype=torch.float32):
    """What rank ``rank`` contributes: different on each rank, known to all."""
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(shape, generator=g)
    return x.to(dtype) if dtype.is_floating_point else (x * 10).to(dtype)


def _dist_stats() -> dict:
    import torchtpu_compile
    return torchtpu_compile.stats()["tpu_dist"]


def _delta(before: dict) -> dict:
    after = _dist_stats()
    return {k: after[k] - before[k] for k in before}


def _staged_group():
    """A group of the same ranks whose collectives are all host-staged (the reference)."""
    from torchtpu_compile import config
    with config.patch(dist_transport="staged"):
        return dist.new_group()


def _collectives(rank, world, group) -> dict:
    """Every collective PJRT carries, on ``group``, each against host arithmetic; returns
    the results by name (host tensors), to compare the transports."""
    everyone = [data(r) for r in range(world)]
    stack = torch.stack(everyone)
    got = {}
    for op, want in [(dist.ReduceOp.SUM, stack.sum(0)), (dist.ReduceOp.AVG, stack.mean(0)),
                     (dist.ReduceOp.MAX, stack.amax(0)), (dist.ReduceOp.MIN, stack.amin(0)),
                     (dist.ReduceOp.PRODUCT, stack.prod(0))]:
        x = data(rank).to("tpu")
        dist.all_reduce(x, op=op, group=group)
        same(x, want, f"all_reduce {op}")
        assert x.device.type == "tpu"
        got[f"all_reduce {op}"] = x.cpu()
    # integers (average truncates), bf16, and a view: the write reaches the base
    base = torch.zeros(2, 4, dtype=torch.int64, device="tpu")
    row = base[1]
    row.copy_(data(rank, (4,), torch.int64).to("tpu"))
    dist.all_reduce(row, group=group)
    same(base[1], sum(data(r, (4,), torch.int64) for r in range(world)), "all_reduce view")
    same(base[0], torch.zeros(4, dtype=torch.int64), "all_reduce view leaves the rest")
    got["all_reduce int64 view"] = base.cpu()
    ints = data(rank, (5,), torch.int32).to("tpu")
    dist.all_reduce(ints, op=dist.ReduceOp.AVG, group=group)
    same(ints, torch.div(sum(data(r, (5,), torch.int32) for r in range(world)), world,
                         rounding_mode="trunc"), "all_reduce avg int32")
    got["all_reduce avg int32"] = ints.cpu()
    half = data(rank, (6,), torch.bfloat16).to("tpu")
    dist.all_reduce(half, group=group)
    same(half, sum(data(r, (6,), torch.bfloat16).float() for r in range(world)), "bf16",
         atol=0.05)
    got["all_reduce bf16"] = half.cpu()
    # async
    x = data(rank).to("tpu")
    work = dist.all_reduce(x, async_op=True, group=group)
    assert work.wait()
    same(x, stack.sum(0), "async all_reduce")
    # broadcast (exact bits, any dtype)
    for src in range(world):
        x = data(rank).to("tpu")
        dist.broadcast(x, src=src, group=group)
        same(x, everyone[src], f"broadcast from {src}")
    flags = (data(rank, (5,)) > 0).to("tpu")
    dist.broadcast(flags, src=1, group=group)
    assert torch.equal(flags.cpu(), data(1, (5,)) > 0), "broadcast bool"
    got["broadcast"] = x.cpu()
    # all_gather (list and into tensor)
    outs = [torch.empty(4, 3, device="tpu") for _ in range(world)]
    dist.all_gather(outs, data(rank).to("tpu"), group=group)
    for r in range(world):
        same(outs[r], everyone[r], f"all_gather[{r}]")
    got["all_gather"] = torch.cat([o.cpu() for o in outs])
    out = torch.empty(world * 4, 3, device="tpu")
    dist.all_gather_into_tensor(out, data(rank).to("tpu"), group=group)
    same(out, torch.cat(everyone), "all_gather_into_tensor")
    got["all_gather_into_tensor"] = out.cpu()
    # reduce_scatter (list and tensor); input: world chunks of (2, 3)
    big = [data(r, (world * 2, 3)) for r in range(world)]
    total = torch.stack(big).sum(0)
    mine = total[rank * 2:(rank + 1) * 2]
    out = torch.empty(2, 3, device="tpu")
    dist.reduce_scatter(out, list(big[rank].to("tpu").chunk(world)), group=group)
    same(out, mine, "reduce_scatter")
    got["reduce_scatter"] = out.cpu()
    out = torch.empty(2, 3, device="tpu")
    dist.reduce_scatter_tensor(out, big[rank].to("tpu"), op=dist.ReduceOp.AVG, group=group)
    same(out, mine / world, "reduce_scatter_tensor avg")
    got["reduce_scatter_tensor avg"] = out.cpu()
    # all_to_all: rank r sends chunk j to rank j
    ins = [data(rank * 10 + j, (3,)).to("tpu") for j in range(world)]
    outs = [torch.empty(3, device="tpu") for _ in range(world)]
    dist.all_to_all(outs, ins, group=group)
    for j in range(world):
        same(outs[j], data(j * 10 + rank, (3,)), f"all_to_all[{j}]")
    got["all_to_all"] = torch.cat([o.cpu() for o in outs])
    inp = torch.cat([data(rank * 10 + j, (3,)) for j in range(world)]).to("tpu")
    out = torch.empty(world * 3, device="tpu")
    dist.all_to_all_single(out, inp, group=group)
    same(out, torch.cat([data(j * 10 + rank, (3,)) for j in range(world)]),
         "all_to_all_single")
    got["all_to_all_single"] = out.cpu()
    # reduce to a root; barrier
    x = data(rank).to("tpu")
    dist.reduce(x, dst=0, op=dist.ReduceOp.MAX, group=group)
    same(x, stack.amax(0) if rank == 0 else everyone[rank], "reduce to rank 0")
    dist.barrier(group=group)
    return got


def check_collectives(rank, world):
    """Every collective on tpu tensors against host values, on the PJRT transport (nothing
    staged) and on a host-staged group (the same results); then what stays host-staged on
    the PJRT group (counted), and the error cases."""
    staged_group = _staged_group()
    before = _dist_stats()
    pjrt = _collectives(rank, world, None)
    moved = _delta(before)
    assert moved["host_staged_collectives"] == 0 and moved["pjrt_collectives"] >= 20, moved
    before = _dist_stats()
    staged = _collectives(rank, world, staged_group)
    moved = _delta(before)
    assert moved["pjrt_collectives"] == 0 and moved["host_staged_collectives"] >= 18, moved
    for name, value in pjrt.items():
        assert torch.equal(value, staged[name]), f"{name}: PJRT {value} host-staged {staged[name]}"
    # Host-staged on the PJRT group, each counted once: uneven all_to_all, point to point.
    before = _dist_stats()
    in_splits = [rank + 1 + j for j in range(world)]  # rank r sends r+1+j elements to rank j
    out_splits = [j + 1 + rank for j in range(world)]
    inp = torch.arange(sum(in_splits), dtype=torch.float32, device="tpu") + 100 * rank
    out = torch.empty(sum(out_splits), device="tpu")
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    want = []
    for j in range(world):
        start = sum(j + 1 + k for k in range(rank))
        want.append(torch.arange(start, start + j + 1 + rank, dtype=torch.float32) + 100 * j)
    same(out, torch.cat(want), "all_to_all_single uneven")
    everyone = [data(r) for r in range(world)]
    if rank == 0:
        dist.send(data(0).to("tpu"), dst=1)
        got = torch.empty(4, 3, device="tpu")
        dist.irecv(got, src=1).wait()
        same(got, everyone[1], "irecv")
    elif rank == 1:
        got = torch.empty(4, 3, device="tpu")
        dist.recv(got, src=0)
        same(got, everyone[0], "recv")
        dist.isend(data(1).to("tpu"), dst=0).wait()
    moved = _delta(before)
    assert moved["host_staged_collectives"] == 3 and moved["host_staged_bytes"] > 0, moved
    # CPU tensors on the same group go through gloo untouched (neither transport)
    before = _dist_stats()
    c = data(rank)
    dist.all_reduce(c)
    same(c, torch.stack(everyone).sum(0), "cpu all_reduce")
    moved = _delta(before)
    assert moved["host_staged_collectives"] == 0 and moved["pjrt_collectives"] == 0, moved
    _bad_reduce_ops(world)
    _mismatched_shapes(rank)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _reference_training(batches, steps):
    """Single-process training on the global batch, on the host: what DDP must reproduce."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches[:steps]:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


def _batches(steps, global_batch=8):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(global_batch, 6, generator=g), torch.randn(global_batch, 3, generator=g))
            for _ in range(steps)]


def _ddp(rank, world, port, compiled):
    init(rank, world, port)
    check_ddp(rank, world, compiled)
    dist.destroy_process_group()


def check_ddp(rank, world, compiled=False):
    """DDP on 2 processes ends with the parameters of one process on the global batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_float32_matmul_precision("highest")
    steps = 3
    batches = _batches(steps)
    model = _mlp()
    if rank == 1:  # DDP must broadcast rank 0's weights at construction
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    ddp = DDP(model.to("tpu"))
    run = torch.compile(ddp, backend="torchtpu") if compiled else ddp
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    per_rank = 8 // world
    for x, y in batches:
        x, y = x[rank * per_rank:(rank + 1) * per_rank], y[rank * per_rank:(rank + 1) * per_rank]
        opt.zero_grad()
        torch.nn.functional.mse_loss(run(x.to("tpu")), y.to("tpu")).backward()
        opt.step()
    ref = _reference_training(batches, steps)
    for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
        assert p.device.type == "tpu"
        same(p, q.detach(), f"DDP{' compiled' if compiled else ''} parameter {name}", atol=1e-5)


@case
def ddp_compiled(rank, world, port):
    _ddp(rank, world, port, compiled=True)


def check_compiled_collectives(rank, world):
    """Functional collectives inside one torch.compile graph on tpu tensors, lowered into its
    program (StableHLO collectives, one replica per rank), with a jax_op call between them in
    the same program: equal to host arithmetic, nothing cut out of the graph, nothing through
    the process group."""
    import jax
    import torch.distributed._functional_collectives as funcol
    from torchtpu_compile import jax_op
    group = dist.group.WORLD
    jax_tanh = jax_op(jax.numpy.tanh, name="dist_check_tanh")

    def f(x):
        y = funcol.all_reduce(jax_tanh(torch.sin(x)) * 2, "avg", group)
        gathered = funcol.all_gather_tensor(y * (x + 1), 0, group)
        scattered = funcol.reduce_scatter_tensor(gathered * 3, "sum", 0, group)
        moved = funcol.all_to_all_single(x * 2, None, None, group)
        root = funcol.broadcast(x, 1, group)
        return y + x, gathered.cos(), scattered, moved, root

    before = _dist_stats()
    out = torch.compile(f, backend="torchtpu", fullgraph=True)(data(rank).to("tpu"))
    moved = _delta(before)
    assert moved["lowered_collectives"] == 5 and moved["compiled_graph_collectives"] == 0 and \
        moved["functional_collectives"] == 0 and moved["host_staged_collectives"] == 0, moved
    assert all(t.device.type == "tpu" for t in out)
    xs = [data(r) for r in range(world)]
    y = sum(torch.tanh(torch.sin(x)) * 2 for x in xs) / world
    gathered = torch.cat([y * (x + 1) for x in xs])
    rows = 4 // world
    same(out[0], y + xs[rank], "compiled all_reduce avg")
    same(out[1], gathered.cos(), "compiled all_gather")
    same(out[2], (world * 3 * gathered).chunk(world)[rank], "compiled reduce_scatter")
    same(out[3], torch.cat([2 * x[rank * rows:(rank + 1) * rows] for x in xs]),
         "compiled all_to_all_single")
    same(out[4], xs[1], "compiled broadcast")


@case
def compiled_collective(rank, world, port):
    """Collectives inside a torch.compile graph, then an eager functional collective."""
    import torch.distributed._functional_collectives as funcol
    init(rank, world, port)
    check_compiled_collectives(rank, world)
    x = data(rank)
    y = funcol.all_gather_tensor(x.to("tpu"), 0, dist.group.WORLD)
    same(y, torch.cat([data(r) for r in range(world)]), "funcol all_gather")
    assert _dist_stats()["host_staged_collectives"] == 0, _dist_stats()
    dist.destroy_process_group()


@case
def core(rank, world, port):
    """The fast suite's one spawn, on the group ``init_process_group()`` makes with no backend
    named: collectives and errors, DDP, DTensor, FSDP2 steps, then a dead peer on a second
    group (which ends both processes)."""
    import time
    from tests.support.dist_fsdp import check_dtensor, check_fsdp
    start = time.monotonic()
    # No backend named: "cpu:gloo,tpu:tpu_dist" (torchtpu_eager/distributed/__init__.py)
    init(rank, world, port, backend=None)
    assert dist.get_backend_config() == "cpu:gloo,tpu:tpu_dist", dist.get_backend_config()
    for name, check in [("collectives", check_collectives),
                        ("compiled collectives", check_compiled_collectives), ("ddp", check_ddp),
                        ("dtensor", check_dtensor),
                        ("fsdp", lambda r, w: check_fsdp(r, w, small=True, steps=2,
                                                         optimizer="sgd"))]:
        check(rank, world)
        print(f"rank {rank}: {name} passed at {time.monotonic() - start:.1f}s", flush=True)
    short = dist.new_group(timeout=datetime.timedelta(seconds=15))
    check_dead_rank(rank, short, what="core")


@case
def client_before_init(rank, world, port):
    """A tpu tensor made before init_process_group: the PJRT client exists and cannot join
    the other process's, so the group is host-staged, said and counted, and still right."""
    x = data(rank).to("tpu")
    init(rank, world, port)
    dist.all_reduce(x)
    same(x, sum(data(r) for r in range(world)), "host-staged all_reduce")
    stats = _dist_stats()
    assert stats["host_staged_groups"] == 1 and stats["pjrt_collectives"] == 0 and \
        stats["host_staged_collectives"] == 1, stats
    dist.destroy_process_group()


@case
def fsdp_eager(rank, world, port):
    from tests.support.dist_fsdp import check_fsdp
    init(rank, world, port)
    check_fsdp(rank, world)
    dist.destroy_process_group()


@case
def fsdp_compiled(rank, world, port):
    from tests.support.dist_fsdp import check_fsdp
    init(rank, world, port)
    check_fsdp(rank, world, compiled=True)
    dist.destroy_process_group()


def _bad_reduce_ops(world):
    import torch.distributed._functional_collectives as funcol
    x = torch.ones(3, device="tpu")
    for bad in [dist.ReduceOp.BAND, dist._make_nccl_premul_sum(2.0)]:
        try:
            dist.all_reduce(x, op=bad)
        except (ValueError, RuntimeError) as exc:
            assert "tpu_dist" in str(exc) and "sum, avg" in str(exc), exc
        else:
            raise AssertionError(f"{bad} on a float tensor did not raise")
    flags = torch.tensor([True, False], device="tpu")
    try:
        dist.all_reduce(flags, op=dist.ReduceOp.AVG)
    except TypeError as exc:
        assert "AVG with boolean inputs" in str(exc), exc
    else:
        raise AssertionError(f"AVG of bool tensors returned {flags.cpu()}")
    try:
        funcol.all_reduce(x, "median", dist.group.WORLD)
    except (ValueError, RuntimeError) as exc:
        assert "median" in str(exc), exc
    else:
        raise AssertionError("unknown reduce op name did not raise")
    # the group still works after the errors: nothing was sent
    dist.all_reduce(x)
    same(x, torch.full((3,), float(world)), "all_reduce after errors")


def check_dead_rank(rank, group, what="dead_rank"):
    """Rank 1 dies (os._exit, no goodbye) while rank 0 waits in an all_reduce on ``group``:
    that one fails on the PJRT transport itself, and the next one before it starts (rank 0
    knows rank 1 is gone), each with DistBackendError naming rank 1, well within the group's
    timeout. Ends both processes (exit 0 after printing ok)."""
    import time
    from torchtpu_compile import config
    x = torch.ones(3, device="tpu")
    dist.all_reduce(x, group=group)
    if rank == 1:
        print(f"rank 1: {what} ok", flush=True)
        time.sleep(2)  # rank 0 is waiting in the next all_reduce by now
        os._exit(0)
    # Without the signature check (a gloo collective that would see the dead peer first),
    # the collective in flight is the transport's own.
    config.dist_check = False  # this process exits below: nothing to restore
    for attempt in ("in flight", "next"):
        launched = _dist_stats()["pjrt_collectives"]
        start = time.monotonic()
        try:
            dist.all_reduce(x, group=group)
            x.cpu()
        except dist.DistBackendError as exc:
            took = time.monotonic() - start
            ran = _dist_stats()["pjrt_collectives"] - launched
            print(f"rank 0: {attempt}: error after {took:.1f}s "
                  f"{'on the pjrt transport' if ran else 'before launching'}: "
                  f"{str(exc).splitlines()[0][:300]}", flush=True)
            assert "rank 1 died" in str(exc), exc
            assert took < 40, took
            assert ran == (1 if attempt == "in flight" else 0), (attempt, ran)
        else:
            raise AssertionError(f"all_reduce with a dead peer returned ({attempt})")
    print(f"rank 0: {what} ok", flush=True)
    os._exit(0)

#: How a peer dies in ``peer_dies``: environment variables tests/slow/test_tpu_dist_slow.py sets.
DEAD_RANK, DIE_WHEN, IDLE_S, CHECKPOINTS = ("DIST_DEAD_RANK", "DIST_DIE_WHEN", "DIST_IDLE_S",
                                            "DIST_CHECKPOINTS")
SURVIVOR_EXIT = 3  # the exit code a survivor chooses (not 0, not a signal's)


@case
def peer_dies(rank, world, port):
    """Rank $DIST_DEAD_RANK is killed (SIGKILL) at $DIST_DIE_WHEN: "idle" (the survivors go
    on with device work of their own for $DIST_IDLE_S seconds, then run an all_reduce), or
    while the survivors wait in an all_reduce: "check" (in its signature check, gloo),
    "pjrt" (on the PJRT transport), "staged" (a complex all_reduce, host-staged). Each
    survivor must get an exception it can catch, then save a checkpoint of its state,
    destroy the group and exit with its own code: never be killed by a signal (jax's
    runtime aborted it) nor wait forever."""
    import signal
    import time
    from torchtpu_compile import config
    dead, when = int(os.environ[DEAD_RANK]), os.environ[DIE_WHEN]
    if when in ("pjrt", "staged"):
        config.dist_check = False  # the collective in flight is the transport's own
    init(rank, world, port, timeout=20)
    weights = data(rank).to("tpu")  # the state a checkpoint holds (never in a collective)
    grads = data(rank, (5,), torch.complex64 if when == "staged" else torch.float32).to("tpu")
    dist.all_reduce(grads)  # the world works
    if rank == dead:
        if when != "idle":
            time.sleep(3)  # the survivors are waiting in the next collective by now
        print(f"rank {rank}: dying", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if when == "idle":
        # Long enough for jax's runtime to see the dead peer (a closed connection, missed
        # heartbeats); a survivor busy with its own work must not be ended meanwhile.
        until = time.monotonic() + float(os.environ[IDLE_S])
        while time.monotonic() < until:
            weights = weights * 1.0
            weights.cpu()
            time.sleep(0.2)
    start = time.monotonic()
    try:
        dist.all_reduce(grads)
        grads.cpu()
    except Exception as exc:  # what a training loop would catch
        took = time.monotonic() - start
        print(f"rank {rank}: caught {type(exc).__name__} after {took:.1f}s: "
              f"{str(exc).splitlines()[0][:400]}", flush=True)
        path = os.path.join(os.environ[CHECKPOINTS], f"rank{rank}.pt")
        torch.save({"rank": rank, "weights": weights.cpu()}, path)
        dist.destroy_process_group()
        print(f"rank {rank}: saved {path} and destroyed the group", flush=True)
        sys.exit(SURVIVOR_EXIT)
    raise AssertionError(f"rank {rank}: all_reduce with a dead peer returned")

def _mismatched_shapes(rank):
    """Ranks disagree on the shape: an error on every rank (not wrong values), then the
    group still works."""
    for name, call in [("all_reduce", lambda x: dist.all_reduce(x)),
                       ("broadcast", lambda x: dist.broadcast(x, src=0))]:
        x = torch.ones(3 + rank, device="tpu")
        try:
            call(x)
        except RuntimeError as exc:
            assert "different shapes" in str(exc) and name in str(exc), exc
        else:
            raise AssertionError(f"rank {rank}: {name} of mismatched shapes returned")
    x = torch.ones(2, device="tpu")
    dist.all_reduce(x)
    same(x, torch.full((2,), 2.0), "all_reduce after a mismatch")


if __name__ == "__main__":
    name, rank, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    CASES[name](rank, world, port)
    print(f"rank {rank}: {name} ok", flush=True)
