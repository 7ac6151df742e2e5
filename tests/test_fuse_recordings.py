"""Defer-and-fuse mode keeps every value a recording produces that something can still read:
short multi-op programs, each against eager CPU PyTorch, found by the OpInfo/ModuleInfo sweep's
``fuse`` path and the probes around it (docs/coverage.md)."""
import pytest
import torch

import torchtpu_eager  # noqa: F401  (registers the device)
from torchtpu_compile import config

TPU = torch.device("tpu", 0)


pytestmark = pytest.mark.usefixtures("defer_and_fuse")   # tests/conftest.py


def test_a_never_written_tensor_read_in_a_recording_stays_readable_after_it_ran():
    # torch.empty's storage reads as zeros the first time: those zeros were a value of the
    # recording that no storage noted, so its run dropped them and the next read of x raised
    # "internal error: a deferred value was dropped before it ran".
    x = torch.empty(2, 3, device=TPU)
    y = x * 0
    # Not eager's torch.empty(2, 3) * 0: its uninitialized memory may hold a NaN, which stays
    # NaN times 0 (a flaky failure in CI); the tpu device's never-written memory is zeros.
    torch.testing.assert_close(y.cpu(), torch.zeros(2, 3))
    assert x.cpu().shape == torch.empty(2, 3).shape
    grown = torch.empty(0, device=TPU)
    grown.resize_(2, 3)  # a new storage, never written
    (grown[1] * 2).cpu()
    assert grown.cpu().shape == (2, 3)


@pytest.mark.parametrize("max_ops", [1, 2, 3])
def test_a_cut_between_an_ops_strided_reads_keeps_the_first_read(max_ops):
    # An op on two transposed views gathers each one (a read graph) before it runs: a cut of
    # the recording at the second read (its max_ops reached) ran the recording without the
    # first read's value, which no storage holds, and the op raised "internal error: a
    # deferred value was dropped before it ran".
    torch.manual_seed(0)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with config.patch(fuse_max_ops=max_ops):
        torch.tpu.set_eager_mode("defer_and_fuse")  # a new executor reads the limit
        x, y = a.to(TPU), b.to(TPU)
        got = ((x * 1).t() + (y * 3).t()) * 2
        torch.testing.assert_close(got.cpu(), ((a * 1).t() + (b * 3).t()) * 2)


@pytest.mark.parametrize("max_ops", [1, 2])
def test_a_cut_at_a_copy_targets_zeros_keeps_the_copied_read(max_ops):
    # copy_ into a view of a never-written storage reads its source (a transposed view: a read
    # graph), then the target's zeros: a cut at the zeros dropped the source's value.
    torch.manual_seed(0)
    a = torch.randn(4, 4)
    with config.patch(fuse_max_ops=max_ops):
        torch.tpu.set_eager_mode("defer_and_fuse")
        x = a.to(TPU)
        target = torch.empty(4, 4, device=TPU)
        target[1].copy_((x * 1).t()[0])
        expected = torch.empty(4, 4)
        expected[1].copy_((a * 1).t()[0])
        torch.testing.assert_close(target[1].cpu(), expected[1])


@pytest.mark.parametrize("mode", ["defer_and_fuse", "strict"])
def test_a_view_of_a_normal_tensor_made_in_inference_mode(mode):
    # Found by the chain sweep (sweep --chain): every view op on a tensor made outside
    # inference mode raised "Cannot set version_counter for inference tensor" inside it, since
    # the view's wrapper was made as an inference tensor; on the CPU it is a normal tensor.
    torch.tpu.set_eager_mode(mode)
    results = {}
    for device in ("cpu", TPU):
        x = torch.arange(9.0, device=device).reshape(3, 3)
        with torch.inference_mode():
            views = [x.t(), x.diagonal(), x[1], *x.unbind(0)]
            x.copy_(x.diagonal().expand(3, 3) * 2)
        results[str(device)] = ([v.is_inference() for v in views],
                                [v.cpu() for v in views], x.cpu())
    assert results["tpu:0"][0] == results["cpu"][0]
    torch.testing.assert_close(results["tpu:0"][1:], results["cpu"][1:])


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_a_reshaped_view_read_then_written_through_its_base_and_views(mode):
    # A read of a reshaped view of a whole storage keeps the storage's values in the view's
    # shape (views.read): its base, other views and writes through any of them must still see
    # and reach the same memory.
    torch.tpu.set_eager_mode(mode)
    a_cpu = torch.arange(6.)
    a = a_cpu.to(TPU)
    for t in (a, a_cpu):
        b = t.view(2, 3)
        c = t.view(3, 2)
        b.cpu()                     # read: the storage is kept as (2, 3)
        t[1] = 10.0                 # a write through the base
        c[2, 1] = -1.0              # and through another view
        c.cpu()
        b.mul_(2)
        t.add_(1)
    torch.testing.assert_close(a.cpu(), a_cpu)
    torch.testing.assert_close(a.view(2, 3).cpu(), a_cpu.view(2, 3))
    torch.testing.assert_close(a.view(3, 2).t().cpu(), a_cpu.view(3, 2).t())
    assert a.view(2, 3).stride() == (3, 1) and a.shape == (6,)
