"""Out of device memory raises ``torch.OutOfMemoryError``, as CUDA's allocator does.

PJRT reports a buffer that does not fit as RESOURCE_EXHAUSTED. It reached users as jax's
``JaxRuntimeError`` (compiled calls), or, on the eager device, as the CPU allocator's error
from a host tensor of the value's full size made to trace the op: ``except
torch.OutOfMemoryError`` missed both, and so did batch-size finders that look for " out of
memory." (accelerate's ``find_executable_batch_size``).

2**48 bytes is past any machine's address space (x86-64 user space is 2**47), so the CPU client
refuses them at once, whatever the host's overcommit setting; the device keeps working after.
"""
from __future__ import annotations

import pytest
import torch
from accelerate.utils.memory import should_reduce_batch_size

import torchtpu_eager  # noqa: F401  (registers the tpu device)
from tests.support.helpers import compile_tpu

TOO_MANY_FLOATS = 1 << 46  # 2**48 bytes of float32


def _check_out_of_memory(info) -> None:
    assert isinstance(info.value, torch.cuda.OutOfMemoryError)  # the same class, as on CUDA
    assert " out of memory." in str(info.value)
    assert should_reduce_batch_size(info.value)


def test_an_eager_value_larger_than_the_device_raises_out_of_memory():
    x = torch.ones(4, device="tpu")
    before = torch.tpu.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.zeros(TOO_MANY_FLOATS, device="tpu").sum().item()
    _check_out_of_memory(info)
    assert "zeros" in str(info.value)  # names the op
    with pytest.raises(torch.OutOfMemoryError) as info:
        x.expand(TOO_MANY_FLOATS // 4, 4).contiguous().sum().item()
    _check_out_of_memory(info)
    assert torch.equal((x * 2).cpu(), torch.full((4,), 2.0))  # the device still works
    assert torch.tpu.memory_allocated() == before


def test_a_compiled_call_whose_result_does_not_fit_raises_out_of_memory(fresh_dynamo):
    fn = compile_tpu(lambda x: x.expand(TOO_MANY_FLOATS // 4, 4) * 2)
    with pytest.raises(torch.OutOfMemoryError) as info:
        fn(torch.ones(4))
    _check_out_of_memory(info)
    small = compile_tpu(lambda x: x * 2)
    assert torch.equal(small(torch.ones(4)), torch.full((4,), 2.0))
