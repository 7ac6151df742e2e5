"""Running an op on the host: for ops that do not lower, random ops and host values.

Inputs are copied to the host, the op runs in eager CPU PyTorch, written arguments and results
are copied back. An op that does not lower goes through the one fallback policy
(``torchtpu_compile.fallback_policy``): counted in ``torchtpu_compile.stats()`` and warned about
once; with ``TORCHTPU_STRICT=1`` it is an error instead.

Example::

    torch.ones(4, device="tpu").unique()       # data-dependent shape: runs on the host
"""
from __future__ import annotations

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false

from torchtpu_compile.fallback_policy import fall_back
from torchtpu_compile.host_semantics import eager_semantics
from torchtpu_compile.lower.support import written_arguments
from torchtpu_compile.profiling import TORCH_PROFILER, around, reentered

from . import views
from .stats import COUNTERS
from .tensor import TpuTensor, contiguous_strides, dense_tensor, is_dense, view_tensor
from .transfer import from_cpu, to_cpu, upload

_CPU = torch.device("cpu")


def _describe(func, args, kwargs) -> str:
    def fmt(v):
        if isinstance(v, torch.Tensor):
            return f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        return repr(v)
    parts = [fmt(a) for a in args] + [f"{k}={fmt(v)}" for k, v in kwargs.items()]
    return f"{func}({', '.join(parts)})"


# In-place random ops that overwrite every element: their input's values are never read, so
# fetching them (which would run deferred work) is skipped.
_OVERWRITES = {
    "aten::normal_", "aten::uniform_", "aten::random_", "aten::exponential_", "aten::cauchy_",
    "aten::log_normal_", "aten::geometric_", "aten::bernoulli_",
}


def _to_host(value, originals: dict, overwritten=False, drawn_into=False):
    if type(value) is TpuTensor:
        if overwritten or drawn_into:
            # Laid out as the tpu tensor is: eager's kernels draw in an order (and, for
            # normal_, by a method) that follows the written tensor's strides, and into a
            # contiguous copy a transposed or narrowed view got other numbers than on CPU.
            host = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype)
            if not overwritten:
                host.copy_(to_cpu(value))
        else:
            host = to_cpu(value)
        originals[id(host)] = (value, host)
        return host
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(v, originals) for v in value)
    if isinstance(value, torch.device) and value.type == "tpu":
        return _CPU
    return value


def _to_device(value, originals: dict):
    if isinstance(value, torch.Tensor):
        known = originals.get(id(value))
        if known is not None and known[1] is value:
            return known[0]  # an in-place or out= result: the tpu tensor itself
        return from_cpu(value) if value.device.type == "cpu" else value
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, originals) for v in value)
    return value


def raise_eagers_error(func, args, kwargs) -> None:
    """Run ``func`` on host copies of its arguments, nothing written back: re-raise the error
    eager raises for them, or return if it raises none.

    Example::

        raise_eagers_error(aten.mm.default, (a, b), {})
        # RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)
    """
    originals: dict = {}
    host_args = _to_host(tuple(args), originals)
    host_kwargs = {k: _to_host(v, originals) for k, v in kwargs.items()}
    with eager_semantics():
        func(*host_args, **host_kwargs)


def run_on_host(func, args, kwargs, reason: str | None):
    """Run ``func`` on host copies; ``reason`` set means "does not lower": the fallback policy
    applies (``torchtpu_compile.fallback_policy``: strict error, else counted and warned)."""
    if TORCH_PROFILER._is_profiler_enabled and not reentered():
        return around(f"torchtpu::fallback {func}", run_on_host, func, args, kwargs, reason,
                      reason=reason or "runs on the host by design")
    if reason is not None:
        fall_back(str(func), _describe(func, args, kwargs), reason, path="eager")
        COUNTERS.add("eager_fallbacks")
    originals: dict = {}
    draws = func._schema.name in _OVERWRITES
    overwrites = draws and not (
        len(args) > 1 and isinstance(args[1], torch.Tensor))  # bernoulli_(p=tensor) reads p
    if draws:
        host_args = (_to_host(args[0], originals, overwritten=overwrites, drawn_into=True),) \
            + _to_host(tuple(args[1:]), originals)
    else:
        host_args = _to_host(tuple(args), originals)
    host_kwargs = {k: _to_host(v, originals) for k, v in kwargs.items()}
    with eager_semantics():
        out = func(*host_args, **host_kwargs)
    # Written arguments (in-place, out=) get their new values back. The schema says which:
    # version counters do not move here, below the ADInplaceOrView key.
    for _, value in written_arguments(func, host_args, host_kwargs):
        for tensor in (value if isinstance(value, (list, tuple)) else (value,)):
            known = originals.get(id(tensor)) if isinstance(tensor, torch.Tensor) else None
            if known is not None:
                _write_back(known[0], tensor)
    return _to_device(out, originals)


def _write_back(t: TpuTensor, host: torch.Tensor) -> None:
    """Give written argument ``t`` its host copy's new value. Where the host kernel resized it
    (an out= of another shape; a QAT observer's empty running min/max, filled per channel),
    ``t`` takes the new shape first, and the layout eager's kernel gave it (``nonzero`` lays
    its out= transposed): written under the old shape, its values were lost or its size and
    storage disagreed."""
    if tuple(t.shape) != tuple(host.shape):
        views.resize(t, host.shape, keep=False)
        if not host.is_contiguous() and is_non_overlapping_and_dense_or_false(host):
            size, stride, offset = tuple(host.shape), tuple(host.stride()), t.storage_offset()
            t._become(view_tensor(t._st, size, stride, offset,
                                  is_dense(size, stride, offset, t._st.numel)))
    views.write(t, upload(host))


def run_through_storage(func, args, kwargs, written):
    """Run in-place ``func`` on the host, on a view of a host copy of ``written``'s whole
    storage that overlaps itself as ``written`` does, then write the storage back.

    Eager's kernel writes through the shared memory element by element: index_put_ with
    accumulate=True into an expanded view adds every value that lands on a location. The
    device computes the view's new value and writes one element per location
    (``views.write``), which drops all but one of those additions (fuzz seed 3401: 27 where
    eager gives 45, no error). Where an argument's elements meet the written ones, eager's
    kernel reads some after writing them: ``x[1:].copy_(x[:-1])`` of a transposed ``x`` carries
    ``x[0]`` forward (seeds 1884, 1893, 3687), where the device copied the old values."""
    storage = written._st
    whole = dense_tensor(storage, tuple(storage.shape), contiguous_strides(tuple(storage.shape)))
    host_storage = to_cpu(whole)
    flat = host_storage.reshape(-1)
    originals: dict = {}

    def host(value):
        # Every view of the storage (the one written, and any read) views the host copy, so
        # the kernel reads what it has written as eager's does.
        if type(value) is TpuTensor and value._st is storage and value.dtype == flat.dtype:
            return flat.as_strided(value.shape, value.stride(), value.storage_offset())
        if isinstance(value, (list, tuple)):
            return type(value)(host(v) for v in value)
        return _to_host(value, originals)
    with eager_semantics():
        func(*host(tuple(args)), **{k: host(v) for k, v in kwargs.items()})
    views.write(whole, upload(host_storage))
    return written
