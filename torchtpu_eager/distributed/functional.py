"""Functional collectives (``torch.ops._c10d_functional``) on tpu tensors.

DTensor, FSDP2 and compiled graphs call these ops rather than the process group's methods.
On a tpu_dist group each one calls the group's method (``_ON_GROUP``, one handler per op), so
it takes the group's transport: PJRT, or host staging where that cannot carry it. On any
other group, or for an op without a handler, it runs host-staged: the inputs are copied to
the host, the same op runs there through the group it names, the result is waited for, then
copied onto the device. Either way the tpu result is complete (or pending on the device, in
order) when returned, so ``wait_tensor`` on it returns it unchanged.

In a graph compiled with ``backend="torchtpu"`` whose collectives all name a tpu_dist group
with known devices, the program builder lowers them into the graph's program
(``lower/collective_graphs.py``; counted as ``stats()["tpu_dist"]["lowered_collectives"]``) and
this module is not called. Otherwise (an uneven ``all_to_all_single``, a coalesced op, another
group) the graph is cut at its collectives: the regions around them run through XLA and each
collective runs here through the process group (``compiled_graph_collectives``, not a
fallback).

Example::

    from torch.distributed._functional_collectives import all_reduce
    y = all_reduce(torch.ones(3, device="tpu"), "sum", group)   # lands in ``run`` below
"""
from __future__ import annotations

import torch

from .. import dispatch, fallback
from . import reduce_ops
from ..tensor import TpuTensor
from .staging import is_tpu, note
from .stats import COUNTERS

NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "_dtensor")
# DTensor's Shard(i) -> Shard(j) redistribution is a collective of its own namespace.
_DTENSOR_OPS = ("shard_dim_alltoall",)
_OPS = ("all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_",
        "all_gather_into_tensor", "all_gather_into_tensor_out",
        "all_gather_into_tensor_coalesced", "reduce_scatter_tensor",
        "reduce_scatter_tensor_out", "reduce_scatter_tensor_coalesced", "all_to_all_single",
        "broadcast", "broadcast_")
_registered = False
_ON_GROUP: dict = {}


def on_group(name: str):
    """Register ``fn(group, *args, **kwargs)`` to run functional collective ``name`` (all its
    overloads) through a tpu_dist group's methods.

    Example::

        @on_group("broadcast")
        def _broadcast(group, input, src, group_name):
            ...
    """
    def register(fn):
        _ON_GROUP[name] = fn
        return fn
    return register


def _tpu_dist_group(group_name):
    """The tpu_dist process group named by a functional collective, or None."""
    from torch.distributed.distributed_c10d import _resolve_process_group
    from .process_group import TpuProcessGroup
    try:
        group = group_name if isinstance(group_name, torch.distributed.ProcessGroup) else \
            _resolve_process_group(group_name)
        if isinstance(group, TpuProcessGroup):  # init_process_group("tpu_dist"): the group
            return group
        # "cpu:gloo,tpu:tpu_dist": a group with one backend per device
        backend = group._get_backend(torch.device("tpu"))
    except Exception:  # not a group with a tpu backend
        return None
    return backend if isinstance(backend, TpuProcessGroup) else None


def group_devices(group_name):
    """The PJRT device ids of a tpu_dist group's ranks if it is on the PJRT transport, else
    None: what a compiled graph needs to lower its collectives into its program."""
    group = _tpu_dist_group(group_name)
    return group._pjrt.devices if group is not None and group._pjrt is not None else None


def _reduce_options(reduce_op: str, dtype, kind=None):
    import torch.distributed as dist
    from torch._C._distributed_c10d import AllreduceOptions
    reduce_ops.resolve(reduce_op, dtype)  # an unknown name: a ValueError naming the ones that work
    opts = (kind or AllreduceOptions)()
    opts.reduceOp = getattr(dist.ReduceOp, reduce_ops.name(reduce_op).upper())
    return opts


def _empty(shape, like):
    return torch.empty(shape, dtype=like.dtype, device=like.device)


@on_group("all_reduce")
def _all_reduce(group, input, reduce_op, group_name):
    return _all_reduce_(group, input.clone(), reduce_op, group_name)


@on_group("all_reduce_")
def _all_reduce_(group, input, reduce_op, group_name):
    group.allreduce([input], _reduce_options(reduce_op, input.dtype)).wait()
    return input


@on_group("all_reduce_coalesced")
def _all_reduce_coalesced(group, inputs, reduce_op, group_name):
    return [_all_reduce(group, t, reduce_op, group_name) for t in inputs]


@on_group("all_reduce_coalesced_")
def _all_reduce_coalesced_(group, inputs, reduce_op, group_name):
    return [_all_reduce_(group, t, reduce_op, group_name) for t in inputs]


@on_group("all_gather_into_tensor")
def _all_gather_into_tensor(group, input, group_size, group_name, out=None):
    if out is None:
        out = _empty((group_size * input.shape[0], *input.shape[1:]), input)
    group.all_gather_single(out, input).wait()
    return out


_ON_GROUP["all_gather_into_tensor_out"] = _all_gather_into_tensor


@on_group("all_gather_into_tensor_coalesced")
def _all_gather_into_tensor_coalesced(group, inputs, group_size, group_name):
    return [_all_gather_into_tensor(group, t, group_size, group_name) for t in inputs]


@on_group("reduce_scatter_tensor")
def _reduce_scatter_tensor(group, input, reduce_op, group_size, group_name, out=None):
    from torch._C._distributed_c10d import ReduceScatterOptions
    if out is None:
        out = _empty((input.shape[0] // group_size, *input.shape[1:]), input)
    opts = _reduce_options(reduce_op, input.dtype, ReduceScatterOptions)
    group.reduce_scatter_single(out, input, opts).wait()
    return out


_ON_GROUP["reduce_scatter_tensor_out"] = _reduce_scatter_tensor


@on_group("reduce_scatter_tensor_coalesced")
def _reduce_scatter_tensor_coalesced(group, inputs, reduce_op, group_size, group_name):
    return [_reduce_scatter_tensor(group, t, reduce_op, group_size, group_name) for t in inputs]


@on_group("all_to_all_single")
def _all_to_all_single(group, input, output_split_sizes, input_split_sizes, group_name):
    rows = sum(output_split_sizes) if output_split_sizes else input.shape[0]
    out = _empty((rows, *input.shape[1:]), input)
    group.alltoall_base(out, input, list(output_split_sizes), list(input_split_sizes)).wait()
    return out


@on_group("broadcast")
def _broadcast(group, input, src, group_name):
    return _broadcast_(group, input.clone(), src, group_name)


@on_group("broadcast_")
def _broadcast_(group, input, src, group_name):
    import torch.distributed as dist
    opts = dist.BroadcastOptions()
    opts.rootRank = src
    group.broadcast([input], opts).wait()
    return input


def _group_name_of(func, args, kwargs):
    for i, argument in enumerate(func._schema.arguments):
        if argument.name == "group_name":
            return args[i] if i < len(args) else kwargs.get("group_name")
    return None


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
    """Run a functional collective on tpu tensors: through its tpu_dist group's transport, or
    host-staged (see module doc)."""
    COUNTERS.add("functional_collectives")
    handler = _ON_GROUP.get(func._schema.name.split("::")[-1]) \
        if func.namespace != "_dtensor" else None
    if handler is not None:
        group = _tpu_dist_group(_group_name_of(func, args, kwargs))
        if group is not None and all(is_tpu(t) for t in _tensors(args)):
            return handler(group, *args, **kwargs)
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
