"""Pinned host memory with "tpu" registered, against what CUDA PyTorch does with pinning.

The tpu hooks' pinned allocator (torchtpu_compile/csrc/native.cpp) serves every way PyTorch
pins: ``Tensor.pin_memory()``, factories with ``pin_memory=True``, DataLoader's pinning
thread; ``is_pinned()`` is true for memory it handed out and still holds.
"""
import gc

import torch
from torch.utils.data import DataLoader, TensorDataset

import torchtpu_eager  # noqa: F401  (registers the device; autoload does too)
from torchtpu_compile import config


def test_pin_memory_copies_and_is_pinned():
    x = torch.randn(3, 4)
    pinned = x.pin_memory()
    assert pinned.is_pinned() and not x.is_pinned()
    assert pinned.data_ptr() != x.data_ptr()
    torch.testing.assert_close(pinned, x, rtol=0, atol=0)
    assert pinned.pin_memory() is pinned          # already pinned: the same tensor, as on CUDA
    assert pinned[1:].is_pinned() and pinned.t().is_pinned()   # views share the memory


def test_pinning_a_tpu_tensor_raises_as_pinning_a_cuda_tensor_does():
    # It ran on the host with a warning and gave the tpu tensor back, unpinned; CUDA raises,
    # so does DataLoader(pin_memory=True) over a dataset of device tensors.
    import pytest
    x = torch.ones(3, device="tpu")
    assert not x.is_pinned()
    with pytest.raises(RuntimeError, match=r"cannot pin 'torch.tpu.FloatTensor' only dense "
                                           r"CPU tensors can be pinned"):
        x.pin_memory()
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        next(iter(DataLoader(TensorDataset(torch.ones(4, 2, device="tpu")), batch_size=2,
                             pin_memory=True)))


def test_pin_memory_keeps_strides():
    x = torch.randn(4, 6).t()[1:]
    pinned = x.pin_memory()
    assert pinned.stride() == x.stride() and pinned.is_pinned()
    torch.testing.assert_close(pinned, x, rtol=0, atol=0)


def test_memory_reused_after_a_pinned_tensor_dies_is_not_pinned():
    pinned = torch.randn(1024).pin_memory()
    address = pinned.untyped_storage().data_ptr()
    del pinned
    gc.collect()
    fresh = [torch.empty(1024) for _ in range(8)]
    reused = [t for t in fresh if t.untyped_storage().data_ptr() == address]
    assert not any(t.is_pinned() for t in fresh), reused


def test_factories_with_pin_memory_make_pinned_host_tensors():
    # Before the native hooks: NotImplementedError (getPinnedMemoryAllocator).
    empty = torch.empty(2, 3, dtype=torch.float16, pin_memory=True)
    assert (empty.device, empty.shape, empty.dtype) == (torch.device("cpu"), (2, 3),
                                                        torch.float16)
    assert empty.is_pinned() and empty[1].is_pinned()
    zeros = torch.zeros(4, 5, pin_memory=True)
    assert zeros.is_pinned()
    torch.testing.assert_close(zeros, torch.zeros(4, 5), rtol=0, atol=0)
    strided = torch.empty_strided((3, 4), (1, 3), pin_memory=True)
    assert strided.stride() == torch.empty_strided((3, 4), (1, 3)).stride()
    assert strided.is_pinned()
    values = torch.tensor([[1, 2], [3, 4]], pin_memory=True)
    assert values.is_pinned() and values.tolist() == [[1, 2], [3, 4]]
    assert not torch.empty(2, 3).is_pinned() and not torch.zeros(4, 5).is_pinned()


def test_empty_tensor_pins():
    pinned = torch.empty(0, 3).pin_memory()
    assert pinned.shape == (0, 3)


def test_non_blocking_upload_from_pinned_memory():
    x = torch.randn(5, 5).pin_memory()
    y = x.to("tpu", non_blocking=True)
    torch.tpu.synchronize()
    torch.testing.assert_close(y.cpu(), x, rtol=0, atol=0)


def test_dataloader_pins_batches():
    data = TensorDataset(torch.arange(12.0).reshape(6, 2), torch.arange(6))
    batches = list(DataLoader(data, batch_size=3, pin_memory=True))
    assert all(x.is_pinned() and y.is_pinned() for x, y in batches)
    torch.testing.assert_close(torch.cat([x for x, _ in batches]), data.tensors[0])


# 256 KiB: above the CPU client's 100 KiB threshold for copying on its thread pool.
_LARGE = 64 * 1024


def _unaligned_pinned(n: int) -> torch.Tensor:
    # The CPU client aliases 64-byte aligned memory instead of copying it, so only an offset
    # view of pinned memory is transferred asynchronously here (any pinned memory on a TPU).
    return torch.randn(n + 1).pin_memory()[1:]


def test_non_blocking_copy_from_pinned_memory_is_asynchronous_and_correct():
    from torchtpu_compile.runtime import transfer
    src = _unaligned_pinned(_LARGE)
    want = src.clone()
    y = src.to("tpu", non_blocking=True)
    # In flight: its source (this memory) is held until a synchronization.
    assert [held.data_ptr() for _, held in transfer._in_flight] == [src.data_ptr()]
    torch.tpu.synchronize()
    assert transfer._in_flight == []
    src.fill_(-1)                                   # allowed after synchronizing
    torch.testing.assert_close(y.cpu(), want, rtol=0, atol=0)
    # Read right after the copy, with no synchronize: the download waits for the transfer.
    z = src.to("tpu", non_blocking=True)
    torch.testing.assert_close(z.cpu(), torch.full_like(want, -1), rtol=0, atol=0)
    # A copy into an existing tpu tensor, converting dtype on the way.
    doubles = torch.randn(_LARGE + 1, dtype=torch.float64).pin_memory()[1:]
    dst = torch.empty(_LARGE, device="tpu")
    dst.copy_(doubles, non_blocking=True)
    torch.testing.assert_close(dst.cpu(), doubles.float(), rtol=0, atol=0)


def test_non_blocking_source_freed_right_after_the_copy():
    from torchtpu_compile.runtime import transfer
    src = _unaligned_pinned(_LARGE)
    want, address = src.clone(), src.data_ptr()
    y = src.to("tpu", non_blocking=True)
    del src
    gc.collect()
    # Its memory is not handed out again while the transfer may read it: fresh pinned blocks
    # of the same size, written at once, do not reach y.
    others = [torch.full((_LARGE + 1,), 7.0).pin_memory() for _ in range(4)]
    assert all(address < o.data_ptr() or address >= o.data_ptr() + o.nbytes for o in others)
    assert transfer._in_flight and transfer._in_flight[0][1].data_ptr() == address
    torch.testing.assert_close(y.cpu(), want, rtol=0, atol=0)
    assert transfer._in_flight == []                 # the download synchronized


def test_a_download_completes_earlier_non_blocking_copies():
    # As .item() / .cpu() synchronize a CUDA stream, so a pinned staging buffer may be refilled
    # after them.
    staging = _unaligned_pinned(_LARGE)
    batches = [torch.randn(_LARGE) for _ in range(3)]
    on_device = []
    for batch in batches:
        staging.copy_(batch)
        on_device.append(staging.to("tpu", non_blocking=True))
        on_device[-1].sum().item()
    for got, want in zip(on_device, batches):
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_blocking_and_pageable_copies_are_taken_during_the_call():
    from torchtpu_compile.runtime import transfer
    pageable = torch.randn(_LARGE + 1)[1:]
    aligned = torch.randn(_LARGE).pin_memory()    # would be aliased by the CPU client
    for src, non_blocking in ((pageable, True), (_unaligned_pinned(_LARGE), False),
                              (aligned, True)):
        want = src.clone()
        y = src.to("tpu", non_blocking=non_blocking)
        assert transfer._in_flight == []
        src.fill_(-1)
        torch.testing.assert_close(y.cpu(), want, rtol=0, atol=0)


def test_dataloader_pinned_batches_copied_non_blocking_match_cpu():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(12, 5), torch.randint(0, 3, (12,)))
    model = torch.nn.Linear(5, 3)
    tpu_model = torch.nn.Linear(5, 3).to("tpu")
    tpu_model.load_state_dict(model.state_dict())
    with config.patch(matmul_precision="highest"):   # CPU's float32 matmuls
        for x, y in DataLoader(data, batch_size=4, pin_memory=True):
            want = torch.nn.functional.cross_entropy(model(x), y)
            got = torch.nn.functional.cross_entropy(
                tpu_model(x.to("tpu", non_blocking=True)), y.to("tpu", non_blocking=True))
            torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
