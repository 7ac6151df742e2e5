"""Pinned host memory with "tpu" registered, against what CUDA PyTorch does with pinning.

The tpu hooks' pinned allocator (torchtpu_compile/csrc/native.cpp) serves every way PyTorch
pins: ``Tensor.pin_memory()``, factories with ``pin_memory=True``, DataLoader's pinning
thread; ``is_pinned()`` is true for memory it handed out and still holds.
"""
import gc

import torch
from torch.utils.data import DataLoader, TensorDataset

import torchtpu_eager  # noqa: F401  (registers the device; autoload does too)


def test_pin_memory_copies_and_is_pinned():
    x = torch.randn(3, 4)
    pinned = x.pin_memory()
    assert pinned.is_pinned() and not x.is_pinned()
    assert pinned.data_ptr() != x.data_ptr()
    torch.testing.assert_close(pinned, x, rtol=0, atol=0)
    assert pinned.pin_memory() is pinned          # already pinned: the same tensor, as on CUDA
    assert pinned[1:].is_pinned() and pinned.t().is_pinned()   # views share the memory


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
