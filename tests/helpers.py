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
def configured(**settings):
    """Set ``torchtpu_compile.config`` attributes for a block, then restore them."""
    saved = {name: getattr(torchtpu_compile.config, name) for name in settings}
    for name, value in settings.items():
        setattr(torchtpu_compile.config, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(torchtpu_compile.config, name, value)


def precision(mode):
    """Run with ``torchtpu_compile.config.matmul_precision = mode``."""
    return configured(matmul_precision=mode)


def strict(enabled=True):
    """Run with ``torchtpu_compile.config.strict = enabled``."""
    return configured(strict=enabled)
