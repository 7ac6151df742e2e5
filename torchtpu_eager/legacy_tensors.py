"""``torch.tpu.FloatTensor`` and the other legacy typed constructors, as ``torch.cuda``'s.

Each class makes a tpu tensor of its dtype the way the CPU class makes a host one (sizes:
uninitialized; a sequence: its values), and ``isinstance`` tells a tpu tensor of that dtype,
as ``isinstance(x, torch.cuda.FloatTensor)`` does on CUDA.

Example::

    torch.tpu.FloatTensor(2, 3).shape                      # torch.Size([2, 3]), on tpu:0
    torch.tpu.LongTensor([1, 2])                           # tensor([1, 2], device='tpu:0')
    isinstance(torch.ones(2, device="tpu"), torch.tpu.FloatTensor)     # True
"""
from __future__ import annotations

import torch

#: class name (the host class's too) -> dtype
_TYPES = {
    "FloatTensor": torch.float32, "DoubleTensor": torch.float64, "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16, "ByteTensor": torch.uint8, "CharTensor": torch.int8,
    "ShortTensor": torch.int16, "IntTensor": torch.int32, "LongTensor": torch.int64,
    "BoolTensor": torch.bool,
}


class _LegacyType(type):
    def __instancecheck__(cls, obj) -> bool:
        return (isinstance(obj, torch.Tensor) and obj.device.type == "tpu"
                and obj.dtype == cls.dtype and not obj.is_sparse)

    def __call__(cls, *args, **kwargs):
        if kwargs.get("device") is not None:
            raise RuntimeError(f"{cls.__name__}: legacy constructors take no device "
                               f"(they make tpu tensors)")
        if len(args) == 1 and isinstance(args[0], torch.Tensor):
            if not isinstance(args[0], cls):  # CUDA's "expected ... (got ...)"
                raise TypeError(f"expected {cls.__name__} (got {args[0].type()})")
            return args[0]  # the same tensor, as torch.cuda.FloatTensor(cuda_float) gives
        host = getattr(torch, cls.__qualname__)(*args)  # the host constructor's rules and errors
        return host.to("tpu")


def legacy_types() -> dict:
    """{name: class} for ``torch.tpu``'s namespace."""
    # The full name as the class's own: Tensor.type(torch.tpu.LongTensor) reads it (the C
    # type's tp_name), as it reads "torch.cuda.LongTensor" from CUDA's classes.
    return {name: _LegacyType(f"torch.tpu.{name}", (), {
                "dtype": dtype, "is_cuda": False, "__module__": "torch.tpu",
                "__qualname__": name}) for name, dtype in _TYPES.items()}
