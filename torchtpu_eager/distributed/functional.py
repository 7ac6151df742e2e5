"""Functional collectives (``torch.ops._c10d_functional``) on tpu tensors.

DTensor, FSDP2 and compiled graphs call these ops rather than the process group's methods.
On tpu tensors each runs host-staged: the inputs are copied to the host, the same op runs
there through the group it names (tpu_dist's group sends host tensors to gloo), the result is
waited for, then copied onto the device. The tpu result is complete when returned, so
``wait_tensor`` on it returns it unchanged.

In a graph compiled with ``backend="torchtpu"`` these ops are where the graph is cut: the
regions around them run through XLA, the collective runs here through the process group
(counted as ``stats()["tpu_dist"]["compiled_graph_collectives"]``, not as a fallback).

Example::

    from torch.distributed._functional_collectives import all_reduce
    y = all_reduce(torch.ones(3, device="tpu"), "sum", group)   # lands in ``run`` below
"""
from __future__ import annotations

import torch

from torchtpu_compile import counters

from .. import dispatch, fallback
from ..tensor import TpuTensor
from .staging import is_tpu, note

NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "_dtensor")
# DTensor's Shard(i) -> Shard(j) redistribution is a collective of its own namespace.
_DTENSOR_OPS = ("shard_dim_alltoall",)
_OPS = ("all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_",
        "all_gather_into_tensor", "all_gather_into_tensor_out",
        "all_gather_into_tensor_coalesced", "reduce_scatter_tensor",
        "reduce_scatter_tensor_out", "reduce_scatter_tensor_coalesced", "all_to_all_single",
        "broadcast", "broadcast_")
_registered = False


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


class _Waited:
    """``op`` run on host tensors, then waited on, so its results can be copied at once."""

    def __init__(self, op):
        self.op = op
        self._schema = op._schema

    def __call__(self, *args, **kwargs):
        out = self.op(*args, **kwargs)
        wait = torch.ops._c10d_functional.wait_tensor.default
        for t in _tensors(out) + _tensors(args):
            wait(t)
        return out

    def __str__(self) -> str:
        return str(self.op)


def run(func, args, kwargs):
    """Run a functional collective on tpu tensors through host memory (see module doc)."""
    counters.add_dist("functional_collectives")
    note([t for t in _tensors(args) if is_tpu(t)])
    return fallback.run_on_host(_Waited(func), args, kwargs, reason=None)


def wait_tensor(func, args, kwargs):
    return args[0]  # tpu results of ``run`` are complete when returned


def wrap_tensor(func, args, kwargs):
    # _wrap_tensor_autograd makes an AsyncCollectiveTensor so the wait can come later; tpu
    # results are complete already: an alias of the same storage is enough.
    t = args[0]
    return TpuTensor(t._st, t._shape, t.stride(), t.storage_offset())


def register() -> None:
    """Route the functional collective ops of tpu tensors to ``run`` (idempotent)."""
    global _registered
    if _registered:
        return
    import torch.distributed._functional_collectives  # noqa: F401  defines _wrap_tensor_autograd
    for namespace in NAMESPACES:
        ns = getattr(torch.ops, namespace)
        for name in _DTENSOR_OPS if namespace == "_dtensor" else _OPS:
            try:
                packet = getattr(ns, name)
            except (AttributeError, RuntimeError):
                continue
            for overload in packet.overloads():
                dispatch.handles(getattr(packet, overload))(run)
    dispatch.handles(torch.ops._c10d_functional.wait_tensor.default)(wait_tensor)
    dispatch.handles(torch.ops._c10d_functional._wrap_tensor_autograd.default)(wrap_tensor)
    _registered = True


def is_collective(target) -> bool:
    """Whether an FX node target is a functional collective (or its wait)."""
    namespace = getattr(target, "namespace", None)
    return namespace in NAMESPACES
