"""tpu_dist's collectives in torch.profiler, in a fresh process (a process group, even of one
rank, joins the PJRT client: not in the test process, whose client other tests made)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

_RUN = textwrap.dedent("""
    import datetime, json, socket, torch
    import torch.distributed as dist
    from torch.profiler import profile
    x = torch.arange(6.0).to("tpu")
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    dist.init_process_group("tpu_dist", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=60))
    with profile(record_shapes=True) as prof:
        dist.all_reduce(x)
    spans = [(e.name, e.time_range.start, e.time_range.end, dict(e.kwinputs))
             for e in prof.profiler.function_events if e.name.startswith("torchtpu::")]
    print(json.dumps({"values": x.cpu().tolist(), "spans": spans}))
    dist.destroy_process_group()
""")


def test_collective_is_a_span_with_its_bytes_and_transport(tmp_path):
    env = dict(os.environ, TORCHTPU_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", _RUN], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["values"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # one rank: the sum is itself
    [collective] = [s for s in out["spans"] if s[0] == "torchtpu::collective all_reduce"]
    assert collective[3] == {"bytes": 24, "transport": "pjrt"}
    # The collective's program runs inside its span.
    runs = [s for s in out["spans"] if s[0].startswith("torchtpu::run tpu_dist")]
    assert runs and all(collective[1] <= r[1] and r[2] <= collective[2] for r in runs)
