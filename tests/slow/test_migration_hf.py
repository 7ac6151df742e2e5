"""Hugging Face Trainer on tpu (tests/migration/hf_trainer.py): the loss curve of a few steps
match the CPU run, eagerly and compiled; a greedy generate() too, eagerly (compiled, it is a
known gap: docs/migration.md).

Each run is a fresh process: accelerate reads ``ACCELERATE_TORCH_DEVICE`` once per process
(its state is shared), which is also how a user sets it.
"""
import json
import subprocess
import sys

import pytest

from tests.support import python_env

pytestmark = pytest.mark.slow


def _run(*args: str, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.migration.hf_trainer", *args],
                          capture_output=True, text=True, timeout=900, env=python_env(**env))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("compiled", [False, True])
def test_trainer_matches_cpu(compiled):
    want = _run("cpu")
    got = _run("tpu", *(["compile"] if compiled else []), ACCELERATE_TORCH_DEVICE="tpu")
    assert (want["device"], got["device"]) == ("cpu", "tpu:0")
    assert (got["frames_compiled"] > 0) == compiled
    assert got["losses"] == pytest.approx(want["losses"], rel=1e-3)
    assert got["sample"] == (None if compiled else want["sample"])


def test_without_the_accelerate_switch_the_batch_stays_on_the_cpu():
    # What ACCELERATE_TORCH_DEVICE is for (docs/migration.md): if accelerate learns the tpu
    # device on its own one day, this fails and the line can leave the guide.
    done = subprocess.run([sys.executable, "-m", "tests.migration.hf_trainer", "tpu"],
                          capture_output=True, text=True, timeout=900, env=python_env())
    assert done.returncode != 0 and "Expected all tensors to be on the same device" in done.stderr
