"""``torch.tpu.amp``: the legacy per-device AMP names, as ``torch.cuda.amp`` keeps them.

Scripts written for CUDA before ``torch.amp`` took a device argument say
``torch.cuda.amp.autocast()`` and ``torch.cuda.amp.GradScaler()``; with the device string
changed they say ``torch.tpu.amp...``. These are ``torch.amp``'s own classes for the tpu, with
CUDA's defaults (float16) and CUDA's deprecation warning pointing at the ``torch.amp`` spelling.

Example::

    scaler = torch.tpu.amp.GradScaler()
    with torch.tpu.amp.autocast(dtype=torch.bfloat16):
        loss = model(x).sum()
    scaler.scale(loss).backward()
"""
from __future__ import annotations

import functools
import warnings

import torch


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"`torch.tpu.amp.{old}(args...)` is deprecated. Please use `{new}` instead.",
                  FutureWarning, stacklevel=3)


class autocast(torch.amp.autocast_mode.autocast):
    """``torch.autocast("tpu", ...)`` under its legacy name (float16 unless ``dtype`` says).

    Example::

        with torch.tpu.amp.autocast(dtype=torch.bfloat16):
            y = model(x)
    """

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16,
                 cache_enabled: bool = True):
        _deprecated("autocast", "torch.amp.autocast('tpu', args...)")
        super().__init__("tpu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("tpu", ...)`` under its legacy name.

    Example::

        scaler = torch.tpu.amp.GradScaler()
        scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True):
        _deprecated("GradScaler", "torch.amp.GradScaler('tpu', args...)")
        super().__init__("tpu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)


def custom_fwd(fwd=None, *, cast_inputs=None):
    """``torch.amp.custom_fwd(..., device_type="tpu")`` under its legacy name.

    Example::

        @staticmethod
        @torch.tpu.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, x): ...
    """
    _deprecated("custom_fwd", "torch.amp.custom_fwd(args..., device_type='tpu')")
    if fwd is None:
        return functools.partial(torch.amp.custom_fwd, device_type="tpu",
                                 cast_inputs=cast_inputs)
    return torch.amp.custom_fwd(fwd, device_type="tpu", cast_inputs=cast_inputs)


def custom_bwd(bwd):
    """``torch.amp.custom_bwd(..., device_type="tpu")`` under its legacy name.

    Example::

        @staticmethod
        @torch.tpu.amp.custom_bwd
        def backward(ctx, grad): ...
    """
    _deprecated("custom_bwd", "torch.amp.custom_bwd(args..., device_type='tpu')")
    return torch.amp.custom_bwd(bwd, device_type="tpu")
