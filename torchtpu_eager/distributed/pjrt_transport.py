"""The PJRT transport of tpu_dist: a collective is a StableHLO program over the group's devices.

Each rank runs the same program (``collective_programs``) with its own tensors' device
buffers; the PJRT client moves the data (gloo between CPU clients, the interconnect on TPU) and
the results are written into the tensors through their views. Nothing passes through host
memory. An in-place collective (all_reduce, broadcast) donates a tensor's buffer to its
result when nothing else holds that buffer, so it needs no second copy of the tensor.
Execution is asynchronous: the tensors hold the pending results at once, and
``PjrtWork.wait()`` blocks until they are ready.

A collective this transport cannot carry (complex dtypes, bitwise reductions, uneven
all_to_all splits, empty or mixed host/tpu tensors) returns None from its method, and the
process group stages it through host memory, counted.

Example::

    transport = PjrtTransport(devices=(0, 2048))
    work = transport.all_reduce([x], "sum", average=False)   # None: not carried
    work.wait()
"""
from __future__ import annotations

import sys

import torch

from torchtpu_compile.lower import collectives
from torchtpu_compile.profiling import spanning

from .. import modes, views
from . import collective_programs as programs
from .staging import is_tpu
from .stats import COUNTERS
from .work import PjrtWork, collective_error


def _signature(tensors) -> tuple:
    return tuple((tuple(t.shape), t.dtype) for t in tensors)


#: References to a buffer only its storage holds, seen from ``_donatable``: the storage,
#: the list of input values, and getrefcount's own argument.
_OWNED = 3


def _donatable(inputs, values) -> tuple:
    """Positions whose input buffer an in-place collective may consume: a tensor that is its
    whole storage, whose buffer nothing else holds (a clone shares its buffer until written,
    a pending work handle or fused graph holds it too)."""
    donate = []
    seen = set()
    for i, t in enumerate(inputs):
        storage = t._st
        if t._dense and t._shape == storage.shape and storage.value is values[i] and \
                id(storage) not in seen and sys.getrefcount(values[i]) <= _OWNED:
            donate.append(i)
        seen.add(id(storage))
    return tuple(donate)


class PjrtTransport:
    """Collectives of one group on the multi-process PJRT client (``devices``: one per rank)."""

    def __init__(self, devices: tuple):
        self.devices = devices
        self.n = len(devices)

    def carries(self, tensors) -> bool:
        """Whether every tensor is a non-empty tpu tensor of a dtype PJRT collectives move."""
        return bool(tensors) and all(is_tpu(t) and t.numel() > 0 and
                                     collectives.transportable(t.dtype) for t in tensors)

    def _run(self, name: str, inputs, written, result, **params) -> PjrtWork:
        """Run collective ``name`` on ``inputs``; its results go into ``written`` (in order)."""
        values = [modes.concrete(views.read(t)) for t in inputs]
        donate = _donatable(inputs, values) if written is inputs else ()
        exe = programs.compiled(name, _signature(inputs), self.devices, donate=donate,
                                **params)
        COUNTERS.add("collectives")  # launched (a peer that died fails it in run or wait)
        COUNTERS.add("pjrt_collectives")
        nbytes = sum(t.numel() * t.element_size() for t in inputs)
        COUNTERS.add("pjrt_bytes", nbytes)
        try:
            with spanning(f"torchtpu::collective {name}", bytes=nbytes, transport="pjrt"):
                buffers = exe.run(values)
        except Exception as exc:
            lost = [inputs[i] for i in donate if values[i].is_deleted()]
            error = collective_error(name, exc)
            if lost:  # say it now, not at a later read's "buffer deleted or donated"
                error = type(error)(
                    f"{error}. The tensors it was writing in place "
                    f"({', '.join(f'{str(t.dtype)[6:]}{list(t.shape)}' for t in lost)}) had "
                    f"given it their memory and hold no value now: reading them raises")
            raise error from exc
        for t, buffer in zip(written, buffers):
            views.write(t, buffer)
        return PjrtWork(buffers, result)

    # Each method: a PjrtWork, or None when the collective is not carried (module doc).

    def all_reduce(self, tensors, reduce: str, average: bool, outputs=None):
        body = collectives.REDUCTIONS.get(reduce)
        if body is None or not self.carries(tensors) or \
                (average and tensors[0].dtype is torch.bool):
            return None
        outs = tensors if outputs is None else outputs
        return self._run("all_reduce", tensors, outs, tensors, reduce=body, average=average)

    def broadcast(self, tensors, root: int):
        if not self.carries(tensors):
            return None
        return self._run("broadcast", tensors, tensors, tensors, root=root)

    def all_gather(self, outputs, input, result):
        """``input`` from every rank into ``outputs``: one tensor of n times its elements, or
        one tensor per rank."""
        if not self.carries(list(outputs) + [input]) or \
                any(o.dtype != input.dtype for o in outputs) or \
                sum(o.numel() for o in outputs) != self.n * input.numel():
            return None
        shapes = tuple(tuple(o.shape) for o in outputs)
        return self._run("all_gather", [input], outputs, result, outputs=shapes)

    def reduce_scatter(self, output, inputs, reduce: str, average: bool, result):
        """Chunk ``rank`` of the reduction into ``output``: ``inputs`` is one tensor of n
        chunks, or the n chunks."""
        body = collectives.REDUCTIONS.get(reduce)
        whole = sum(t.numel() for t in inputs)
        if body is None or not self.carries(list(inputs) + [output]) or \
                whole != self.n * output.numel() or \
                (len(inputs) > 1 and len({t.numel() for t in inputs}) != 1) or \
                any(t.dtype != output.dtype for t in inputs):
            return None
        return self._run("reduce_scatter", inputs, [output], result,
                         output=tuple(output.shape), reduce=body, average=average)

    def all_to_all(self, outputs, inputs, result):
        """Equal chunks only: ``inputs``/``outputs`` are one tensor of n chunks, or n each."""
        sizes = {t.numel() for t in (inputs if len(inputs) > 1 else [])} | \
            {t.numel() for t in (outputs if len(outputs) > 1 else [])}
        whole_in = sum(t.numel() for t in inputs)
        if not self.carries(list(inputs) + list(outputs)) or len(sizes) > 1 or \
                whole_in % self.n or whole_in != sum(t.numel() for t in outputs) or \
                len({t.dtype for t in list(inputs) + list(outputs)}) != 1:
            return None
        shapes = tuple(tuple(o.shape) for o in outputs)
        return self._run("all_to_all", inputs, outputs, result, outputs=shapes)

    def barrier(self):
        """A one-element all-reduce over the group, waited for."""
        from ..transfer import from_cpu
        token = from_cpu(torch.zeros(1, dtype=torch.int32))
        work = self._run("all_reduce", [token], [token], None, reduce="add", average=False)
        work.wait()
        return work
