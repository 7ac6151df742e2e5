"""Helpers shared by the decomposition families: the dtypes a decomposition computes in.

Example::

    computing_dtype(torch.bfloat16)          # torch.float32, as eager's CPU kernels compute
    float_dtypes(torch.tensor([1, 2]))       # (torch.float32, torch.float32)
"""
from __future__ import annotations

import torch


def computing_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for the half-width floats, which eager's CPU kernels compute in; else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def float_dtypes(*tensors):
    """(computing dtype, result dtype): integers give the default float, as eager does."""
    result = torch.result_type(*tensors) if len(tensors) > 1 else tensors[0].dtype
    if not result.is_floating_point:
        result = torch.get_default_dtype()
    return computing_dtype(result), result
