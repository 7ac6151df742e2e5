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

SCRIPT = pathlib.Path(__file__).parent / "support" / "cpu_only_training.py"


def _start(autoload: bool) -> subprocess.Popen:
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1" if autoload else "0")
    return subprocess.Popen([sys.executable, str(SCRIPT)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _result(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_cpu_training_script_is_the_same_with_torchtpu_autoloaded():
    # DataLoader(pin_memory=True) (with and without workers), checkpointing both ways, CPU
    # autocast, AdamW defaults, clipping, a scheduler: values compared exactly. Both runs at
    # once: each is mostly the import of torch.
    with_tpu, without = _start(autoload=True), _start(autoload=False)
    assert _result(with_tpu) == _result(without)
