"""What the decomposition tests share: ``check`` runs a function compiled in strict mode (the op
must run through XLA, not fall back) and compares it with eager CPU PyTorch;
``check_on_both_paths`` does that and runs it on the eager tpu device too."""
from __future__ import annotations

import torch

from tests.support.helpers import compile_tpu
from torchtpu_compile import config

NAN, INF = float("nan"), float("inf")
aten = torch.ops.aten


def check(fn, *args, rtol=1e-4, atol=1e-5):
    with config.patch(strict=True, matmul_precision="highest"):
        actual = compile_tpu(fn)(*args)
    expected = fn(*args)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def check_on_both_paths(fn, *args, rtol=0.0, atol=0.0):
    """``check`` (compile path), then the eager tpu device, strict; exactly eager's unless
    given tolerances."""
    check(fn, *args, **({"rtol": rtol, "atol": atol} if rtol or atol else {}))
    with config.patch(strict=True, matmul_precision="highest"):
        actual = fn(*(a.to("tpu") for a in args))
    torch.testing.assert_close(torch.utils._pytree.tree_map(lambda t: t.cpu(), actual),
                               fn(*args), rtol=rtol, atol=atol, equal_nan=True)
