"""Small helpers shared by the compile-path tests."""
from __future__ import annotations

import contextlib

import torch
import torch._dynamo

import torchtpu_compile


def compile_tpu(fn, **kwargs):
    """``torch.compile`` with our backend, after forgetting earlier Dynamo caches."""
    torch._dynamo.reset()
    return torch.compile(fn, backend="torchtpu", **kwargs)


@contextlib.contextmanager
def precision(mode):
    """Run with ``torchtpu_compile.config.matmul_precision = mode``, then restore it."""
    saved = torchtpu_compile.config.matmul_precision
    torchtpu_compile.config.matmul_precision = mode
    try:
        yield
    finally:
        torchtpu_compile.config.matmul_precision = saved


@contextlib.contextmanager
def strict(enabled=True):
    saved = torchtpu_compile.config.strict
    torchtpu_compile.config.strict = enabled
    try:
        yield
    finally:
        torchtpu_compile.config.strict = saved
