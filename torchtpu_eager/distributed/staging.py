"""Host staging: tpu_dist's fallback transport, for what the PJRT transport cannot carry.

A collective on tpu tensors copies them to host memory, runs the same collective with gloo on
the host copies, and copies the results back onto the device. That is correct everywhere and
costs two device<->host copies per collective (on the PJRT CPU client, two memcpys). It is said
once in the log and counted in ``torchtpu_compile.stats()["tpu_dist"]``
(``host_staged_collectives``, ``host_staged_bytes``).

Example::

    host, back = stage_in([x])       # host copies of tpu tensors (CPU tensors pass through)
    gloo.allreduce(host).wait()
    stage_out(back)                  # results written into x through its view
"""
from __future__ import annotations

import torch

from torchtpu_compile._logging import warn_once
from torchtpu_compile.profiling import spanning

from .. import views
from ..tensor import TpuTensor
from ..transfer import to_cpu, upload
from .stats import COUNTERS


def is_tpu(t) -> bool:
    return type(t) is TpuTensor


def note(tensors) -> None:
    """Count a host-staged collective over ``tensors`` (and say once that it is staged)."""
    nbytes = sum(t.numel() * t.element_size() for t in tensors if is_tpu(t))
    if nbytes or any(is_tpu(t) for t in tensors):
        COUNTERS.add("host_staged_collectives")
        COUNTERS.add("host_staged_bytes", nbytes)
        warn_once(("tpu_dist", "host-staged"),
                  "torchtpu: some tpu_dist collectives are staged through host memory and gloo "
                  "(the PJRT transport cannot carry them); counted in "
                  "torchtpu_compile.stats()['tpu_dist']['host_staged_collectives']")


def host_input(t) -> torch.Tensor:
    """A host tensor with ``t``'s values (``t`` itself if it is on the host already)."""
    return to_cpu(t) if is_tpu(t) else t


def host_output(t) -> torch.Tensor:
    """A host tensor to receive ``t``'s new values (its old ones are not read)."""
    return torch.empty(t.shape, dtype=t.dtype) if is_tpu(t) else t


def stage_in(tensors, read: bool = True, count: bool = True):
    """(host tensors for the transport, pairs (tpu tensor, host tensor) to copy back).

    ``read=False`` for pure outputs: their current values are not downloaded.
    ``count=False`` when the collective's tensors are counted by one ``note`` elsewhere.
    """
    if count:
        note(tensors)
    host, back = [], []
    # The collective itself then runs in gloo (its own "gloo:<op>" events in the profiler).
    with spanning("torchtpu::collective host_staging", transport="host",
                  bytes=sum(t.numel() * t.element_size() for t in tensors if is_tpu(t))):
        for t in tensors:
            h = host_input(t) if read else host_output(t)
            host.append(h)
            if is_tpu(t):
                back.append((t, h))
    return host, back


def stage_out(pairs) -> None:
    """Write each host result into its tpu tensor (through its view, reaching every alias)."""
    for dst, host in pairs:
        views.write(dst, upload(host.to(dst.dtype).reshape(dst.shape)))
