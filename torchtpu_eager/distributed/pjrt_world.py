"""Joining the processes' PJRT clients into one multi-process client (jax's distributed runtime).

Each process has one PJRT client (``torchtpu_compile.runtime.client``: jax's backend). Before
that client is created, ``jax.distributed.initialize`` can join it with the other processes':
``jax.devices()`` then lists every process's devices, and a program compiled for several of
them runs its collectives across processes (gloo over TCP on the CPU client; the interconnect
on TPU). ``init_process_group("tpu_dist")`` does that here, the first time a tpu_dist group is
made: rank 0 picks a free port and publishes the coordinator address through the group's
c10d store, every rank joins with the group's timeout.

If the client exists already (a tpu tensor was made before ``init_process_group``), it cannot
join any more: the ranks agree on that through the store and every collective of the group is
staged through host memory instead (``placement`` returns the reason). So is every collective
of a group made while ``TORCHTPU_DIST_TRANSPORT=staged`` is set (to compare the transports).

Example::

    devices, why = placement(store, rank=0, world_size=2, timeout=timedelta(minutes=5))
    # devices: (0, 2048), one PJRT device id per group rank; or why: "the PJRT client ..."
"""
from __future__ import annotations

import datetime
import os
import socket
import threading

from torchtpu_compile._logging import log

_PREFIX = "tpu_dist_pjrt/"
_lock = threading.Lock()
_world: dict = {}  # after joining: {"address": ..., "processes": ..., "process_id": ...}


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
    """Where the other ranks reach rank 0: TORCHTPU_DIST_COORDINATOR_HOST, MASTER_ADDR, the
    host of the rendezvous TCPStore, else this host's name."""
    host = os.environ.get("TORCHTPU_DIST_COORDINATOR_HOST") or os.environ.get("MASTER_ADDR")
    while not host and store is not None:
        host = getattr(store, "host", None)
        store = getattr(store, "underlying_store", None)
    return host or socket.gethostname()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


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
            decision = f"{_coordinator_host(store)}:{_free_port()}"
        store.set(f"{_PREFIX}coordinator", decision)
    decision = store.get(f"{_PREFIX}coordinator").decode()
    if decision.startswith("staged:"):
        return decision[len("staged:"):]
    if decision == "joined":
        from jax._src import distributed as jax_distributed
        _world.update(address=jax_distributed.global_state.coordinator_address,
                      processes=world_size, process_id=rank)
        return None
    seconds = _seconds(timeout)
    # Gloo is what carries collectives between CPU clients; on TPU the flag is unused.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # A dead process is found by its missed heartbeats; a clean exit waits for the others
    # at most the group's timeout (and never longer than jax's default of five minutes).
    jax.distributed.initialize(decision, num_processes=world_size, process_id=rank,
                               initialization_timeout=seconds,
                               heartbeat_timeout_seconds=min(seconds, 100),
                               shutdown_timeout_seconds=min(seconds, 300))
    _world.update(address=decision, processes=world_size, process_id=rank)
    log.info("torchtpu: tpu_dist joined the PJRT clients of %d processes (coordinator %s)",
             world_size, decision)
    return None


def placement(store, rank: int, world_size: int, timeout):
    """(PJRT device ids of the group's ranks in rank order, None) or (None, why not).

    The first group made in a process joins the multi-process client (module doc); every
    group then exchanges its ranks' device ids through its store. The group can run PJRT
    collectives when every rank's device is in one joined client: a group of processes that
    never joined (each client alone, each device id 0) cannot, and is host-staged.
    """
    from torchtpu_compile.runtime.client import get_client
    if os.environ.get("TORCHTPU_DIST_TRANSPORT", "").strip().lower() == "staged":
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


__all__ = ["placement"]
