"""The migration suite's distributed scripts (tests/migration/ddp_train.py, fsdp2_train.py):
each spawns 2 processes as PyTorch's tutorials do, once on CPU with gloo (the reference) and
once on tpu with tpu_dist, and the losses, the parameters, the ``torch.distributed.checkpoint``
contents and the training resumed from that checkpoint must agree (float32 matmuls at
"highest" in both runs).

Each script runs in a fresh process group of its own (a new session), killed whole at the
deadline: ``mp.spawn``'s workers would outlive a parent killed alone.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

from tests.migration.test_scripts import TOLERANCE, assert_same
from tests.support import python_env

pytestmark = pytest.mark.slow


def _run(script: str, device: str, tmp_path, deadline: float = 540) -> dict:
    out = tmp_path / f"{script}-{device}.pt"
    proc = subprocess.Popen([sys.executable, "-m", f"tests.migration.{script}", device, str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=python_env(TORCHTPU_MATMUL_PRECISION="highest"),
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"{script} {device}: past the {deadline}s deadline\n"
                             f"{output[-4000:]}") from None
    assert proc.returncode == 0, f"{script} {device} exited {proc.returncode}\n{output[-4000:]}"
    return torch.load(out, weights_only=False)


def _check(script, tmp_path):
    want, got = _run(script, "cpu", tmp_path), _run(script, "tpu", tmp_path)
    tolerance = TOLERANCE["float32"]
    for rank, (g, w) in enumerate(zip(got["ranks"], want["ranks"])):
        assert g["parameter_devices"] == ["tpu"] and w["parameter_devices"] == ["cpu"], rank
        for key in ("losses", "continued", "resumed", "parameters", "resumed_parameters"):
            assert_same(g[key], w[key], tolerance, f"rank {rank} {key}")
        # resuming from the checkpoint retraces the same steps on the same device
        assert_same(g["resumed"], g["continued"], (1e-6, 1e-6), f"rank {rank} resumed losses")
        assert_same(g["resumed_parameters"], g["parameters"], (1e-6, 1e-6),
                    f"rank {rank} resumed parameters")
        # everything ran on the device: no host fallback, every tpu collective on PJRT
        stats = g["stats"]
        assert stats["fallback_ops"] == {} and stats["eager_fallbacks"] == 0, stats
        assert stats["tpu_dist"]["host_staged_collectives"] == 0, stats
        assert stats["tpu_dist"]["pjrt_collectives"] > 0, stats
    # the checkpoint written from tpu tensors holds CPU's values, read back on the host
    assert_same(got["checkpoint"], want["checkpoint"], tolerance, "checkpoint")
    return got


def test_ddp_with_distributed_checkpoint_matches_cpu(tmp_path):
    got = _check("ddp_train", tmp_path)
    # DDP keeps the replicas equal
    assert_same(got["ranks"][1]["parameters"], got["ranks"][0]["parameters"], (0, 0), "replicas")


def test_fsdp2_with_sharded_distributed_checkpoint_matches_cpu(tmp_path):
    _check("fsdp2_train", tmp_path)
