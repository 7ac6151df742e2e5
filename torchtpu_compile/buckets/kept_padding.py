"""Padded host copies of a bucket's inputs, kept from one call to the next.

A decode step pads its KV cache at every call: a static cache whose length Dynamo made dynamic
(prompts of different lengths) is padded to the same bucket call after call, a dynamic cache
to the same bucket while it grows inside it. Making a new zero tensor each time, uploading it
(a resident input: registered, then dropped) and freeing it cost more than the step's math on a
tiny model. Instead each input position keeps its padded tensor: the real elements are copied
into it at every call (so every write to the input is seen), the padding stays zero (a call
reuses it only when its real region holds the last one's), and the same tensor object comes
back, and its buffer (the tensor's own memory on the CPU client) is kept for it
(``transfer.keep_aliased``), so ``transfer.to_buffers`` finds it and uploads nothing.

Only where no one else can see the kept tensor: host tensors (CPU, no grad), a program whose
outputs are its results (no output handed back as an input or a view of one: ``handed_back``),
and results read on the host, which the program has finished computing (so it no longer reads
its inputs) by the time the call returns. One set per thread.

Example::

    kept = KeptPadding()
    x_padded = kept.pad(0, x, plan)          # plan: layout.pad_plan(...)
    again = kept.pad(0, x, plan)             # the same tensor, x's values copied in again
"""
from __future__ import annotations

import threading

import torch

from ..runtime.transfer import keep_aliased
from .layout import pad_with

_Tensor = torch.Tensor
#: Entries kept per graph (input positions times threads), a bound on memory.
_MAX_KEPT = 64


def handed_back(program) -> frozenset | None:
    """The argument positions ``program`` hands back as outputs (an output that is an input or
    a view of one), or None where its outputs are unknown (a partitioned program: eager ops
    between XLA regions may return views of anything).

    Example::

        handed_back(program)      # frozenset(): every output is a program result
    """
    slots = getattr(program, "slots", None)
    if slots is None or getattr(program, "executable", None) is None:
        return None
    return frozenset(slot.index for slot in slots if slot.kind == "input" or (
        slot.kind == "view" and slot.value.get("of") == "input"))


def _holds(region: tuple, last: tuple) -> bool:
    return all(new.stop >= old.stop for new, old in zip(region, last))


class KeptPadding:
    """One padded tensor per (input position, thread) of a bucketed graph (module doc)."""

    def __init__(self):
        self._kept: dict = {}   # (position, thread) -> (padded shape, dtype, region, out, view)

    def pad(self, position: int, tensor: torch.Tensor, plan) -> torch.Tensor:
        """``layout.pad_with(tensor, plan)``, in the tensor kept for ``position`` where it
        can be (module doc)."""
        if plan is None:
            return tensor
        if type(tensor) is not _Tensor or not tensor.is_cpu or tensor.requires_grad:
            return pad_with(tensor, plan)
        real, padded, region, shape = plan
        key = (position, threading.get_ident())
        entry = self._kept.get(key)
        if entry is not None and entry[0] == padded and entry[1] == tensor.dtype \
                and _holds(region, entry[2]):
            out, view = entry[3], entry[4]
        else:
            if len(self._kept) >= _MAX_KEPT:
                self._kept.clear()
            out = tensor.new_zeros(padded)
            view = out.reshape(shape)
            keep_aliased(view)  # its buffer then serves every call it is passed to
        out[region] = tensor.reshape(real)
        self._kept[key] = (padded, tensor.dtype, region, out, view)
        return view

    def clear(self) -> None:
        """Drop every kept tensor (their memory goes with them)."""
        self._kept.clear()
