"""Matmul/convolution precision: which mode applies, and what it means per platform.

Modes follow ``torch.set_float32_matmul_precision``:

=========  ==========================  ===========================================
mode       on TPU                      on CPU / GPU (emulated)
=========  ==========================  ===========================================
medium     precision DEFAULT:          f32 operands rounded to bf16 (``reduce_precision``
           bf16 multiply, f32 acc.     e8m7), products and sums in f32
high       precision HIGH (bf16 x3,    plain f32 (closer than TPU's ~2^-16 per product;
           ~2^-16 rel. per product)    see docs/precision.md)
highest    precision HIGHEST (f32)     plain f32
=========  ==========================  ===========================================

Example::

    torch.set_float32_matmul_precision("highest")
    resolve_precision()        # -> "highest"
"""
from __future__ import annotations

import torch

from .. import config
from .._logging import warn_once

MODES = ("medium", "high", "highest")


# torch's own getters, called straight (``torch.get_float32_matmul_precision`` and
# ``torch.backends.cuda.matmul.fp32_precision`` wrap them in Python frames): every compiled
# call and eager program resolves the precision.
_torch_precision = torch._C._get_float32_matmul_precision
_backend_precision = torch._C._get_fp32_precision_getter


def resolve_precision(platform: str | None = None) -> str:
    """The precision mode in force now: config, else the user's torch setting, else medium."""
    mode = config.matmul_precision
    if mode is None:
        # torch's default is "highest" with the backend flags at "none"; an explicit
        # set_float32_matmul_precision(...) call sets them, even to "highest" ("ieee").
        mode = _torch_precision()
        if mode == "highest" and _backend_precision("cuda", "matmul") == "none":
            mode = "medium"  # nobody chose: the TPU default
    if platform == "tpu" and mode != "medium":
        warn_once(("precision", mode),
                  "matmul precision %r runs matmuls and convolutions in several bf16 passes on "
                  "TPU (up to 6x slower than 'medium'); set it to 'medium' for speed", mode)
    return mode
