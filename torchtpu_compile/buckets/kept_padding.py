"""Padded host copies of a bucket's inputs, kept from one call to the next.

A decode step pads its KV cache at every call: a static cache whose length Dynamo made dynamic
(prompts of different lengths) is padded to the same bucket call after call, a dynamic cache
to the same bucket while it grows inside it. Making a new zero tensor each time, uploading it
(a resident input: registered, then dropped) and freeing it cost more than the step's math on a
tiny model. Instead each input position keeps a padded tensor per padded shape (a dynamic
cache's decode loop goes through every bucket again at each new prompt): the real elements are
copied into it at every call (so every write to the input is seen), the padding stays zero (a
call whose real region does not hold the last one's zeroes it first), and the same tensor
object comes back, and its buffer (the tensor's own memory on the CPU client) is kept for it
(``transfer.keep_aliased``), so ``transfer.to_buffers`` finds it and uploads nothing.

Only where no one else can see the kept tensor: host tensors (CPU, no grad), a program whose
outputs are its results (no output handed back as an input or a view of one: ``handed_back``),
and results read on the host, which the program has finished computing (so it no longer reads
its inputs) by the time the call returns. One set per thread.

Example::

    kept = KeptPadding()
    inputs = [x]
    plans = [(0, plan, tuple(plan[0]), tuple(plan[1]))]   # plan: layout.pad_plan(...)
    kept.pad_all(inputs, plans)              # inputs[0] padded
    again = [x]
    kept.pad_all(again, plans)               # the same tensor, x's values copied in again
"""
from __future__ import annotations

import threading

import torch

from ..runtime.transfer import keep_aliased
from .layout import pad_with

_Tensor = torch.Tensor
#: Bounds on what one graph keeps (input positions x threads x buckets): past either, the
#: oldest kept tensors that the call at hand does not use go first (a call's own are kept
#: whatever their size, as one per position always was). Within them a decode loop that
#: starts again at a short prompt allocates nothing; past them it allocates a bucket's
#: tensors when it reaches the bucket.
_MAX_KEPT = 256
_MAX_KEPT_BYTES = 256 << 20


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


#: Real regions whose destination view a kept tensor remembers (a decode loop's lengths).
_MAX_TARGETS = 1024


class _Kept:
    """One kept padded tensor: ``out`` at the padded factored shape, ``view`` at the shape
    the program takes, the last real ``region`` copied in, and a view of ``out`` per real
    extent seen (``targets``): made once, not at every step of a decode loop."""

    __slots__ = ("region", "out", "view", "targets", "used")

    def __init__(self, out: torch.Tensor, view: torch.Tensor):
        self.out, self.view = out, view
        self.region = ()
        self.targets: dict = {}
        self.used = 0   # the last call that used it (KeptPadding._calls)


class KeptPadding:
    """The padded tensors of a bucketed graph's inputs, one per (input position, thread,
    padded shape, dtype) (module doc): a decode loop that starts again at a short prompt
    finds each bucket's tensor from its last run, its padding zeroed again."""

    def __init__(self):
        self._kept: dict = {}   # (position, thread, padded shape, dtype) -> _Kept, oldest first
        self._bytes = 0
        self._calls = 0

    def pad_all(self, inputs: list, plans) -> None:
        """``inputs[j] = layout.pad_with(inputs[j], plan)`` for each ``(j, plan, real key,
        padded key)`` of ``plans`` (the keys: the plan's real and padded factored shapes as
        tuples), in the tensor kept for it where it can be (module doc). The real elements of
        all of them are copied in by one ``torch._foreach_copy_``: a decode step pads each
        layer's keys and values, and one copy call per cache cost more than the bytes it
        moved."""
        targets, sources = [], []
        thread = threading.get_ident()
        self._calls = call = self._calls + 1
        for j, plan, extent, padded in plans:
            tensor = inputs[j]
            if type(tensor) is not _Tensor or not tensor.is_cpu or tensor.requires_grad:
                inputs[j] = pad_with(tensor, plan)
                continue
            real, _, region, shape = plan
            key = (j, thread, padded, tensor.dtype)
            kept = self._kept.get(key)
            if kept is None:
                out = tensor.new_zeros(padded)
                self._make_room(out.nbytes)
                kept = self._kept[key] = _Kept(out, out.reshape(shape))
                self._bytes += out.nbytes
                keep_aliased(kept.view)  # its buffer then serves every call it is passed to
            elif not _holds(region, kept.region):
                kept.out.zero_()  # a shorter real region: the last one's values are padding
            target = kept.targets.get(extent)
            if target is None:
                if len(kept.targets) >= _MAX_TARGETS:
                    kept.targets.clear()
                target = kept.targets[extent] = kept.out[region]
            kept.region = region
            kept.used = call
            targets.append(target)
            sources.append(tensor.reshape(real))
            inputs[j] = kept.view
        if targets:
            torch._foreach_copy_(targets, sources)

    def _make_room(self, nbytes: int) -> None:
        kept, call = self._kept, self._calls
        for key in list(kept):  # oldest first
            if len(kept) < _MAX_KEPT and self._bytes + nbytes <= _MAX_KEPT_BYTES:
                return
            entry = kept.get(key)  # (another thread's call may have dropped it)
            if entry is not None and entry.used != call and kept.pop(key, None) is not None:
                self._bytes -= entry.out.nbytes

    def clear(self) -> None:
        """Drop every kept tensor (their memory goes with them)."""
        self._kept.clear()
        self._bytes = 0
