"""Joining the processes' PJRT clients into one multi-process client (jax's distributed runtime).

Each process has one PJRT client (``torchtpu_compile.runtime.client``: jax's backend). Before
that client is created, jax's distributed runtime can join it with the other processes':
``jax.devices()`` then lists every process's devices, and a program compiled for several of
them runs its collectives across processes (gloo over TCP on the CPU client; the interconnect
on TPU). ``init_process_group("tpu_dist")`` does that here, the first time a tpu_dist group is
made: rank 0 starts the coordination service and publishes its address through the group's
c10d store, every rank joins with the group's timeout.

The service runs in a process of its own (``coordinator.py``), not in rank 0 as
``jax.distributed.initialize`` puts it: there, rank 0 dying would make jax abort every other
process. Each process keeps a lifeline to it, and ``gone`` says which ranks' processes have
ended, so that the next collective raises instead of aborting or waiting on them.

If the client exists already (a tpu tensor was made before ``init_process_group``), it cannot
join any more: the ranks agree on that through the store and every collective of the group is
staged through host memory instead (``placement`` returns the reason). So is every collective
of a group made while ``TORCHTPU_DIST_TRANSPORT=staged`` is set (to compare the transports).

Example::

    devices, why = placement(store, rank=0, world_size=2, timeout=timedelta(minutes=5))
    # devices: (0, 2048), one PJRT device id per group rank; or why: "the PJRT client ..."
"""
from __future__ import annotations

import atexit
import datetime
import os
import socket
import threading

from torchtpu_compile import config
from torchtpu_compile._logging import log

_PREFIX = "tpu_dist_pjrt/"
_lock = threading.Lock()
#: After joining: {"address", "processes", "process_id"}, and "lifeline" (coordinator.Lifeline)
#: when this package made the world.
_world: dict = {}
_coordinator: list = []  # rank 0: the coordinator's Popen (kept: it outlives this process)


def _seconds(timeout) -> int:
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    return max(int(timeout or 300), 10)


def _client_exists() -> bool:
    """Whether this process's PJRT client (or any jax backend) has been created."""
    from jax._src import xla_bridge
    from torchtpu_compile.runtime import client
    return client._make_client.cache_info().currsize > 0 or xla_bridge.backends_are_initialized()


def _coordinator_host(store) -> str:
    """Where the other ranks reach rank 0: ``config.dist_coordinator_host``, MASTER_ADDR (as
    torch.distributed reads it), the host of the rendezvous TCPStore, else this host's name."""
    host = config.dist_coordinator_host or os.environ.get("MASTER_ADDR")
    while not host and store is not None:
        host = getattr(store, "host", None)
        store = getattr(store, "underlying_store", None)
    return host or socket.gethostname()


def _join(store, rank: int, world_size: int, timeout) -> str | None:
    """Join jax's distributed runtime as process ``rank`` of ``world_size`` (all ranks call
    this together); None when joined, else why it cannot be (the same on every rank)."""
    if _world:
        return None
    import jax
    if jax.distributed.is_initialized():
        state = "joined"  # the program called jax.distributed.initialize itself
    elif _client_exists():
        state = ("the PJRT client was created before init_process_group (a tpu tensor was "
                 "made first), and a client cannot join other processes once it exists; "
                 "call init_process_group before touching the tpu device")
    else:
        state = "yes"
    store.set(f"{_PREFIX}able/{rank}", state)
    if rank == 0:
        states = [store.get(f"{_PREFIX}able/{r}").decode() for r in range(world_size)]
        refused = [(r, why) for r, why in enumerate(states) if why not in ("yes", "joined")]
        if refused:
            decision = f"staged:rank {refused[0][0]}: {refused[0][1]}"
        elif set(states) == {"joined"}:
            decision = "joined"
        elif "joined" in states:
            decision = ("staged:some ranks called jax.distributed.initialize themselves and "
                        "others did not")
        else:
            try:
                decision = _start_coordinator(store, world_size, timeout)
            except Exception as exc:  # every rank raises it, none waits for a coordinator
                decision = f"error:{exc}"
        store.set(f"{_PREFIX}coordinator", decision)
    decision = store.get(f"{_PREFIX}coordinator").decode()
    if decision.startswith("staged:"):
        return decision[len("staged:"):]
    if decision.startswith("error:"):
        raise RuntimeError(f"tpu_dist: rank 0 could not start the coordination service of the "
                           f"PJRT world: {decision[len('error:'):]}")
    if decision == "joined":
        from jax._src import distributed as jax_distributed
        _world.update(address=jax_distributed.global_state.coordinator_address,
                      processes=world_size, process_id=rank)
        return None
    from .coordinator import Lifeline
    address, lifeline_port = decision.rsplit(" ", 1)
    seconds = _seconds(timeout)
    lifeline = Lifeline(address.rsplit(":", 1)[0].strip("[]"), int(lifeline_port), rank,
                        timeout=seconds)
    atexit.register(lifeline.goodbye)
    # Gloo is what carries collectives between CPU clients; on TPU the flag is unused.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    _connect(address, world_size, rank, seconds)
    _world.update(address=address, processes=world_size, process_id=rank, lifeline=lifeline)
    log.info("torchtpu: tpu_dist joined the PJRT clients of %d processes (coordinator %s)",
             world_size, address)
    return None


def _start_coordinator(store, world_size: int, timeout) -> str:
    """Start the coordination service's process (rank 0); "host:port lifeline_port"."""
    from .coordinator import start
    seconds = _seconds(timeout)
    port, lifeline_port, process = start(world_size, seconds, *_heartbeat_and_shutdown(seconds))
    _coordinator.append(process)
    host = _coordinator_host(store)
    return f"{f'[{host}]' if ':' in host else host}:{port} {lifeline_port}"


def _heartbeat_and_shutdown(seconds: int) -> tuple:
    """The service marks a process failed after missing heartbeats this long; a client's
    shutdown at exit waits at most this long (never longer than jax's defaults)."""
    return min(seconds, 100), min(seconds, 300)


def _connect(address: str, world_size: int, rank: int, seconds: int) -> None:
    """What ``jax.distributed.initialize`` does on a rank, less starting the service (the
    coordinator process runs it): this process's client, in jax's global state, where
    jax's backends find it when they make the PJRT client."""
    from jax._src import distributed as jax_distributed
    from jax._src.lib import _jax
    heartbeat, shutdown = _heartbeat_and_shutdown(seconds)
    client = _jax.get_distributed_runtime_client(
        address, rank, init_timeout=seconds, heartbeat_timeout=heartbeat,
        shutdown_timeout=shutdown, use_compression=True)
    client.connect()
    state = jax_distributed.global_state
    state.coordinator_address, state.process_id, state.num_processes = address, rank, world_size
    state.client = client
    if os.environ.get("JAX_PARTITION_INDEX"):  # as jax's initialize reads it (multi-slice)
        state.partition_index = int(os.environ["JAX_PARTITION_INDEX"])
    state.initialize_preemption_sync_manager()


def gone(processes=None) -> dict:
    """{rank: "exited" | "died"} of the world's processes (of ``processes`` only, if given)
    that have ended; -1 if the coordinator process itself has. Empty when nothing is known:
    every process alive, or a world this package did not make (no lifeline)."""
    lifeline = _world.get("lifeline")
    lost = lifeline.gone() if lifeline is not None else None
    if not lost:  # checked before every collective: the common case stays cheap
        return {}
    return {r: how for r, how in lost.items()
            if processes is None or r == -1 or r in processes}


def watched() -> bool:
    """Whether this process has a lifeline (``gone`` can know of ranks that ended)."""
    return "lifeline" in _world


def processes_of(devices) -> tuple:
    """The world process (rank of the joined world) that owns each PJRT device id."""
    from torchtpu_compile.runtime.client import get_client
    owner = {d.id: d.process_index for d in get_client().pjrt.devices()}
    return tuple(owner[d] for d in devices)


def placement(store, rank: int, world_size: int, timeout):
    """(PJRT device ids of the group's ranks in rank order, None) or (None, why not).

    The first group made in a process joins the multi-process client (module doc); every
    group then exchanges its ranks' device ids through its store. The group can run PJRT
    collectives when every rank's device is in one joined client: a group of processes that
    never joined (each client alone, each device id 0) cannot, and is host-staged.
    """
    from torchtpu_compile.runtime.client import get_client
    if config.dist_transport == "staged":
        return None, "TORCHTPU_DIST_TRANSPORT=staged when the group was made"
    if world_size > 1:
        with _lock:
            why = _join(store, rank, world_size, timeout)
        if why is not None:
            return None, why
    client = get_client()
    world = _world.get("address") or f"alone:{socket.gethostname()}:{os.getpid()}"
    store.set(f"{_PREFIX}device/{rank}", f"{client.device.id}@{world}")
    entries = [store.get(f"{_PREFIX}device/{r}").decode().split("@", 1)
               for r in range(world_size)]
    devices = tuple(int(device) for device, _ in entries)
    worlds = {w for _, w in entries}
    if len(worlds) > 1 or len(set(devices)) != world_size:
        return None, ("the group's processes are not in one joined PJRT client (a group "
                      "across processes that joined different worlds, or none)")
    return devices, None


__all__ = ["gone", "placement", "processes_of", "watched"]
