"""Autograd runs the backward of tpu tensors on the thread that calls ``backward()``.

PyTorch's autograd engine runs a non-CPU device's backward on a worker thread of its own (one
per device, as for CUDA) and parks the calling thread until it is done. For the tpu device that
buys nothing (every op is dispatched from Python holding the GIL, so the two threads never run
at once) and costs a handoff at each ``backward()``: both threads wake, and the backward runs
with the other core's cold caches. On a small MLP's SGD step that was 0.4-0.5 ms of 2-3 ms, in
strict and defer-and-fuse mode alike. CPU tensors' backward already runs on the calling thread.

The engine has one switch for it, per thread: ``torch.autograd.set_multithreading_enabled``.
Each thread turns it off at its first tpu op (``config.backward_on_calling_thread``), so a
thread that never touches tpu keeps PyTorch's default, and a thread that sets it afterwards
keeps its own choice. It applies to every device's backward started from that thread (a CUDA
backward from it runs there too, as it would inside ``set_multithreading_enabled(False)``).

Example::

    x = torch.randn(3, device="tpu", requires_grad=True)
    seen = []
    x.register_hook(lambda g: seen.append(threading.get_ident()))
    x.sum().backward()
    assert seen == [threading.get_ident()]
"""
from __future__ import annotations

import threading

import torch

from torchtpu_compile import config

_seen = threading.local()


def enter_thread() -> int:
    """Set up the calling thread for tpu ops (once per thread); returns its ident.

    Example::

        enter_thread() == threading.get_ident()     # True
    """
    if not getattr(_seen, "done", False):
        _seen.done = True
        if config.backward_on_calling_thread:
            torch._C._set_multithreading_enabled(False)
    return threading.get_ident()
