"""tpu_dist, the long multi-process runs (minutes each on 2 busy cores: Dynamo traces DDP's
and FSDP2's forward with their graph breaks; a transformer's first steps trace many ops).
Every run is bounded by a deadline (tests/dist_launch.py)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dist_launch import check, launch  # noqa: E402


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
