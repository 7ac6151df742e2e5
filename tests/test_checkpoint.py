"""Activation checkpointing (torch.utils.checkpoint) on the tpu device and in compiled graphs.

The cases run in a subprocess (tests/support/checkpoint_worker.py): checkpointing on the tpu
device used to abort the process in backward ("terminate called without an active exception"),
and an abort must fail a test, not end the test session. The other two eager modes run in
tests/slow/test_checkpoint_modes.py.
"""
import subprocess
import sys

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import torchtpu_eager  # noqa: F401
from tests.support import python_env

WORKER = "tests.support.checkpoint_worker"


def run_worker(what: str, **env) -> None:
    """Run tests/support/checkpoint_worker.py ``what`` in a fresh process; fail with what it
    printed."""
    done = subprocess.run([sys.executable, "-m", WORKER, what], capture_output=True, text=True,
                          timeout=900, env=python_env(**env))
    report = [line for line in done.stdout.splitlines() if line.startswith(("ok ", "FAIL "))]
    assert done.returncode == 0 and report, (
        f"exit status {done.returncode}\n" + "\n".join(report) + "\n" + done.stderr[-3000:])
    assert not any(line.startswith("FAIL") for line in report)


def test_checkpoint_on_the_tpu_device_matches_cpu():
    run_worker("eager")


def test_checkpoint_in_compiled_graphs_matches_cpu():
    run_worker("compile")


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_cpu_checkpoint_is_untouched_by_the_tpu_device(use_reentrant):
    """With the tpu device registered (autoloaded at ``import torch``), checkpointing CPU
    tensors asks for the default accelerator's autocast: it must not fail for "tpu"."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    checkpoint(layer, x, use_reentrant=use_reentrant).sum().backward()
    expected = torch.autograd.grad(layer(x).sum(), x)[0]
    torch.testing.assert_close(x.grad, expected)


def test_fork_rng_saves_and_restores_the_tpu_generator():
    torch.tpu.manual_seed(3)
    with torch.random.fork_rng(devices=[0], device_type="tpu"):
        inside = torch.rand(4, device="tpu").cpu()
    after = torch.rand(4, device="tpu").cpu()
    torch.testing.assert_close(inside, after)


def test_rng_state_operators_replay_a_draw_on_tpu_tensors():
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state
    from torchtpu_eager.compile_support import teach_dynamo
    teach_dynamo()
    x = torch.empty(5, device="tpu")
    state, first = run_and_save_rng_state(torch.ops.aten.rand_like.default, x)
    again = run_with_rng_state(state, torch.ops.aten.rand_like.default, x)
    torch.testing.assert_close(again.cpu(), first.cpu())
