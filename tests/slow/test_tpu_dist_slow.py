"""tpu_dist, the long multi-process runs: DDP under torch.compile (about 3 minutes on 2 busy
cores: Dynamo traces DDP's forward and its graph breaks)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dist_launch import check, launch  # noqa: E402


def test_ddp_compiled_matches_single_process_on_global_batch():
    check(launch("ddp_compiled", deadline=480))
