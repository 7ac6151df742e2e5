"""Installing torchtpu must not change what a CPU-only script does.

The package autoloads at ``import torch`` and makes "tpu" PyTorch's current accelerator, which
every ``torch.accelerator``-dependent default then sees (DataLoader pinning, checkpoint's device
inference, ...). The same CPU script runs with the autoload on and off and prints the same.
"""
import json
import os
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).with_name("cpu_only_training.py")


def _run(autoload: bool) -> dict:
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1" if autoload else "0")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_cpu_training_script_is_the_same_with_torchtpu_autoloaded():
    # DataLoader(pin_memory=True) (with and without workers), checkpointing both ways, CPU
    # autocast, AdamW defaults, clipping, a scheduler: values compared exactly.
    with_tpu = _run(autoload=True)
    without = _run(autoload=False)
    assert with_tpu == without
