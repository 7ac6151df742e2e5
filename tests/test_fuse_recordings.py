"""Defer-and-fuse mode keeps every value a recording produces that something can still read:
short multi-op programs, each against eager CPU PyTorch, found by the OpInfo/ModuleInfo sweep's
``fuse`` path and the probes around it (docs/coverage.md)."""
import pytest
import torch

import torchtpu_eager  # noqa: F401  (registers the device)
from torchtpu_compile import config

TPU = torch.device("tpu", 0)


@pytest.fixture(autouse=True)
def defer_and_fuse():
    saved = torch.tpu.get_eager_mode()
    torch.tpu.set_eager_mode("defer_and_fuse")
    with config.patch(matmul_precision="highest"):
        yield
    torch.tpu.set_eager_mode(saved)


def test_a_never_written_tensor_read_in_a_recording_stays_readable_after_it_ran():
    # torch.empty's storage reads as zeros the first time: those zeros were a value of the
    # recording that no storage noted, so its run dropped them and the next read of x raised
    # "internal error: a deferred value was dropped before it ran".
    x = torch.empty(2, 3, device=TPU)
    y = x * 0
    torch.testing.assert_close(y.cpu(), torch.empty(2, 3) * 0)
    assert x.cpu().shape == torch.empty(2, 3).shape
    grown = torch.empty(0, device=TPU)
    grown.resize_(2, 3)  # a new storage, never written
    (grown[1] * 2).cpu()
    assert grown.cpu().shape == (2, 3)
