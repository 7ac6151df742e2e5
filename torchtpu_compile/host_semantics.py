"""Eager PyTorch run on the host from inside a dispatch handler, with eager's semantics.

Inside a ``__torch_dispatch__`` handler (the eager tpu device's, or a TorchDispatchMode's)
PyTorch excludes the dispatch keys above Python, among them Conjugate, Negative and ZeroTensor.
A CPU kernel that conjugates lazily inside (``torch.linalg.pinv`` of a complex matrix takes
``U.mH``) then has the conjugate bit ignored by its next op: a wrong result and no error. Host
work of ours (an op that falls back) runs with those keys back.

aot_autograd runs the first call of every compiled function under such a mode (its custom-op
aliasing check, ``torch._functorch.config.check_custom_op_aliasing``), so the first call of a
graph cut around such an op was wrong too (Inductor's as well); the cut graph runs without it.

Example::

    with eager_semantics():
        out = torch.linalg.pinv(host_matrix)     # as eager computes it
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode_temporarily

_VIEW_KEYS = (torch._C.DispatchKey.Conjugate, torch._C.DispatchKey.Negative,
              torch._C.DispatchKey.ZeroTensor)


def _first_call_analysis_active() -> bool:
    stack = _get_current_dispatch_mode_stack()
    return bool(stack) and type(stack[-1]).__name__ == "_AnalyzeCustomOpInputOutputMode"


@contextlib.contextmanager
def eager_semantics():
    """Run the body as eager PyTorch would: the conjugate, negative and zero-tensor keys
    included, and without aot_autograd's first-call analysis mode on top (module doc).

    Example::

        with eager_semantics():
            out = func(*host_args, **host_kwargs)
    """
    excluded = [k for k in _VIEW_KEYS if torch._C._dispatch_tls_is_dispatch_key_excluded(k)]
    for key in excluded:
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
    try:
        if _first_call_analysis_active():
            with _pop_mode_temporarily():
                yield
        else:
            yield
    finally:
        for key in excluded:
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, True)


@contextlib.contextmanager
def host_factories():
    """Tensor factories without a device make host tensors in the body, whatever
    ``torch.set_default_device`` says: the graphs, checks and constants we build at compile
    and build time are host values. Under a tpu default device (the usual first step of a
    port) they were made on the device: bucketed programs failed at their padded sizes
    ("found at least two devices, cpu and tpu:0") and compiled per shape, and index checks
    fell back to eager PyTorch.

    Example::

        with host_factories():
            positions = torch.arange(8)     # on the host
    """
    if torch.get_default_device().type == "cpu":
        yield
        return
    with torch.device("cpu"):
        yield
