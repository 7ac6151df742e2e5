"""tpu_dist, the long multi-process runs (minutes each on 2 busy cores: Dynamo traces DDP's
and FSDP2's forward with their graph breaks; a transformer's first steps trace many ops).
Every run is bounded by a deadline (tests/support/dist_launch.py)."""
from __future__ import annotations

import signal
import time

import pytest
import torch

from tests.support.dist_launch import check, launch
from tests.support.dist_workers import data

pytestmark = pytest.mark.slow


def test_ddp_compiled_matches_single_process_on_global_batch():
    check(launch("ddp_compiled", deadline=480))


def test_compiled_graph_with_collective():
    # functional collectives inside a fullgraph torch.compile graph, lowered into its program
    check(launch("compiled_collective", deadline=300))


def test_fsdp2_transformer_eager_matches_single_process():
    # fully_shard per block + root, AdamW, 3 steps: global loss each step, every parameter
    check(launch("fsdp_eager", deadline=580))


def test_fsdp2_transformer_compiled_matches_single_process():
    check(launch("fsdp_compiled", deadline=580))


def test_client_made_before_init_is_host_staged_and_counted():
    check(launch("client_before_init", deadline=150))


@pytest.mark.parametrize("dead, when", [(0, "idle"), (0, "check"), (0, "pjrt"), (0, "staged"),
                                        (1, "idle"), (1, "pjrt")])
def test_survivors_of_a_killed_rank_catch_an_exception_save_and_exit(tmp_path, dead, when):
    # Rank `dead` is SIGKILLed, idle or while the other waits in an all_reduce (its signature
    # check, the PJRT transport, host staging). The survivor must catch DistBackendError
    # naming the rank, torch.save its state, destroy_process_group() and exit with its own
    # code (3): jax's runtime used to abort it (exit -6) right after the error. Idle, the
    # survivor works on its own for longer than jax takes to see the death (at once for the
    # coordinator's rank 0; after the 20 s heartbeat timeout for rank 1).
    from tests.support.dist_workers import SURVIVOR_EXIT
    idle = 10 if dead == 0 else 25
    start = time.monotonic()
    results = launch("peer_dies", deadline=150, env={
        "DIST_DEAD_RANK": str(dead), "DIST_DIE_WHEN": when, "DIST_IDLE_S": str(idle),
        "DIST_CHECKPOINTS": str(tmp_path)})
    took = time.monotonic() - start
    report = "\n".join(f"--- rank {r.rank} (exit {r.returncode}) ---\n{r.output[-3000:]}"
                       for r in results)
    assert results[dead].returncode == -signal.SIGKILL, report
    survivor = results[1 - dead]
    assert survivor.returncode == SURVIVOR_EXIT, report
    assert "caught DistBackendError" in survivor.output, report
    assert f"rank {dead} died" in survivor.output, report
    saved = torch.load(tmp_path / f"rank{1 - dead}.pt")
    assert saved["rank"] == 1 - dead
    assert torch.equal(saved["weights"], data(1 - dead)), saved
    assert took < 120, f"{took:.0f}s\n{report}"
