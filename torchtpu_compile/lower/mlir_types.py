"""The MLIR spelling of torch dtypes and tensor types, for StableHLO we write ourselves.

Example::

    tensor_type((4, 3), torch.float32)     # "tensor<4x3xf32>"
    tensor_type((), torch.int64)           # "tensor<i64>"
"""
from __future__ import annotations

import torch

ELEMENT_TYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
                 torch.float64: "f64", torch.int64: "i64", torch.int32: "i32",
                 torch.int16: "i16", torch.int8: "i8", torch.uint8: "ui8", torch.bool: "i1",
                 torch.complex64: "complex<f32>", torch.float8_e4m3fn: "f8E4M3FN",
                 torch.float8_e5m2: "f8E5M2", torch.float8_e4m3fnuz: "f8E4M3FNUZ",
                 torch.float8_e5m2fnuz: "f8E5M2FNUZ"}


def tensor_type(shape, dtype) -> str:
    """The MLIR tensor type of ``shape`` and ``dtype`` (a torch dtype or an element name)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in ELEMENT_TYPES:
            raise TypeError(f"no MLIR element type for {dtype}")
        dtype = ELEMENT_TYPES[dtype]
    return f"tensor<{''.join(f'{int(d)}x' for d in shape)}{dtype}>"
