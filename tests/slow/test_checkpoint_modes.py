"""Activation checkpointing on the tpu device in the two other eager modes (test_checkpoint.py
runs the default, strict one): each case against eager CPU, in a subprocess."""
import pytest

from tests.test_checkpoint import run_worker

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("variable", ["TORCH_TPU_LAUNCH_BLOCKING", "TORCH_TPU_DEFER_AND_FUSE"])
def test_checkpoint_on_the_tpu_device_in_each_mode(variable):
    run_worker("eager", **{variable: "1"})
