"""``torch.tpu``: the device module, as ``torch.cuda`` is for CUDA.

Example::

    import torch
    torch.tpu.is_available()          # True: the PJRT CPU client stands in without a TPU
    torch.tpu.manual_seed(0)
    x = torch.randn(3, device="tpu")
    torch.tpu.synchronize()
    torch.tpu.memory_allocated()      # bytes of live device buffers
    with torch.tpu.stream(torch.tpu.Stream()):   # streams: ordered no-ops (streams.py)
        y = x * 2
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .modes import get_eager_mode, set_eager_mode  # noqa: F401  (part of the module API)
from . import amp  # noqa: F401  (torch.tpu.amp: the legacy AMP names, as torch.cuda.amp)
from . import streams as _streams
from .streams import (Event, Stream, StreamContext, current_stream, default_stream,  # noqa: F401
                      set_stream, stream)
from .device import check_device  # noqa: F401
from .rng import get_rng_state, initial_seed, manual_seed, seed, set_rng_state  # noqa: F401
from .legacy_tensors import legacy_types

globals().update(legacy_types())  # FloatTensor, LongTensor, ...: torch.cuda's legacy classes

#: ``except torch.tpu.OutOfMemoryError`` as ``except torch.cuda.OutOfMemoryError``.
OutOfMemoryError = torch.OutOfMemoryError

# Read by torch.utils.checkpoint: an initialized device has RNG state to save and restore
# around recomputation (its dropout masks), which the tpu generator always has.
_initialized = True


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def init() -> None:
    """Start the device (the PJRT client), as ``torch.cuda.init()`` starts CUDA; the first op
    would. Calling it again does nothing."""
    _client()


_lazy_init = init  # called by libraries that initialize CUDA ahead of use


def ipc_collect() -> None:
    """Nothing to collect: tpu memory is never shared between processes by IPC handles. Kept
    so that scripts calling it (between training and evaluation) run unchanged."""


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return 1  # one PJRT device per process; more chips are more processes (tpu_dist)


def current_device() -> int:
    return 0


def set_device(device) -> None:
    check_device(device)


class device:
    """Context manager selecting a tpu device, as ``torch.cuda.device``: there is one, tpu:0.

    Example::

        with torch.tpu.device(0):
            state = torch.tpu.get_rng_state()
    """

    def __init__(self, device):
        check_device(device)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class device_of(device):
    """``torch.tpu.device_of(tensor)``: selects the tensor's device if it is a tpu one, as
    ``torch.cuda.device_of`` does (a no-op with one device)."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == "tpu" else None)


def get_rng_state_all() -> list:
    return [get_rng_state()]


def set_rng_state_all(states) -> None:
    for state in states:
        set_rng_state(state)


def get_amp_supported_dtype() -> list:
    """The dtypes ``torch.autocast("tpu", dtype=...)`` accepts."""
    return [torch.bfloat16, torch.float16]


def manual_seed_all(seed_value: int) -> None:
    manual_seed(seed_value)


def seed_all() -> None:
    seed()


def synchronize(device=None) -> None:
    """Wait until every queued op has finished (runs pending deferred ops first)."""
    _streams.synchronize_device()


def _client():
    from torchtpu_compile.runtime.client import get_client
    return get_client()


def get_device_name(device=None) -> str:
    client = _client()
    return f"{client.platform}: {client.device.device_kind}"


@dataclass(frozen=True)
class DeviceProperties:
    name: str
    platform: str
    device_kind: str
    total_memory: int
    major: int = 0
    minor: int = 0


def get_device_properties(device=None) -> DeviceProperties:
    client = _client()
    major, minor = get_device_capability(device)
    return DeviceProperties(get_device_name(), client.platform, client.device.device_kind,
                            mem_get_info(device)[1], major, minor)


def get_device_capability(device=None) -> tuple:
    """``(major, minor)``: the TPU generation (``"TPU v5 lite"``: (5, 0)); on the CUDA plugin
    the GPU's compute capability; (0, 0) on the CPU client. A TPU's numbers are not CUDA
    compute capabilities: ask ``is_bf16_supported()`` for dtypes, not ``major >= 8``.

    Example::

        torch.tpu.get_device_capability()      # (0, 0) here (the PJRT CPU client)
    """
    import re
    check_device(device)
    pjrt = _client().device
    compute = getattr(pjrt, "compute_capability", None)  # jaxlib's GPU devices: "9.0"
    found = re.fullmatch(r"(\d+)\.(\d+)", str(compute)) if compute else None
    if found is None:
        version = re.search(r"\bv(\d+)", pjrt.device_kind)
        return (int(version.group(1)), 0) if version else (0, 0)
    return int(found.group(1)), int(found.group(2))


def utilization(device=None) -> int:
    """Percent of now the device is busy, as ``torch.cuda.utilization`` reports NVML's: PJRT
    reports no such figure, so this is a sample of this moment: 100 while ops issued are still
    running, else 0."""
    check_device(device)
    return 0 if _streams.device_idle() else 100


# --- memory: the bytes of live PJRT buffers (torchtpu_compile.runtime.memory counts them) ----

def _figures() -> dict:
    from torchtpu_compile.runtime import memory
    return memory.snapshot()


def _platform_stats() -> dict:
    from torchtpu_compile.runtime import memory
    return memory.platform_stats(_client().device)


def memory_allocated(device=None) -> int:
    """Bytes of the live device buffers: tensors, resident weights, outputs of programs in
    flight. Memory not yet written (``torch.empty`` on tpu) holds no buffer."""
    check_device(device)
    return _figures()["allocated_bytes"]


def max_memory_allocated(device=None) -> int:
    """The peak of ``memory_allocated()`` since start or ``reset_peak_memory_stats()``."""
    check_device(device)
    return _figures()["peak_allocated_bytes"]


def memory_reserved(device=None) -> int:
    """Bytes the device's allocator holds: its own figure where the platform reports one (it
    includes programs and scratch space), else the live buffers (no caching allocator)."""
    check_device(device)
    return max(memory_allocated(), int(_platform_stats().get("bytes_in_use", 0)))


def max_memory_reserved(device=None) -> int:
    check_device(device)
    return max(max_memory_allocated(), int(_platform_stats().get("peak_bytes_in_use", 0)))


def reset_peak_memory_stats(device=None) -> None:
    """Start the peaks again from now (the platform allocator's own peak cannot be reset)."""
    check_device(device)
    from torchtpu_compile.runtime import memory
    memory.reset_peaks()


def reset_accumulated_memory_stats(device=None) -> None:
    """Start the totals of bytes and buffers made and freed again from zero."""
    check_device(device)
    from torchtpu_compile.runtime import memory
    memory.reset_totals()


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def memory_cached(device=None) -> int:
    """``memory_reserved`` under its old name, as ``torch.cuda.memory_cached``."""
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    return max_memory_reserved(device)


def reset_max_memory_cached(device=None) -> None:
    reset_peak_memory_stats(device)


def memory_stats(device=None) -> dict:
    """``torch.cuda.memory_stats``' keys where they mean something here (an ordered dict).

    Example::

        torch.tpu.memory_stats()["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    """
    import collections
    check_device(device)
    figures = _figures()
    reserved, peak_reserved = memory_reserved(), max_memory_reserved()
    stats = {}
    # Every live buffer is in use: no caching allocator keeps freed blocks, so active equals
    # allocated.
    for kind in ("allocated_bytes", "active_bytes"):
        stats[f"{kind}.all.current"] = figures["allocated_bytes"]
        stats[f"{kind}.all.peak"] = figures["peak_allocated_bytes"]
        stats[f"{kind}.all.allocated"] = figures["allocated_total"]
        stats[f"{kind}.all.freed"] = figures["freed_total"]
    for kind in ("allocation", "active"):
        stats[f"{kind}.all.current"] = figures["allocations"]
        stats[f"{kind}.all.peak"] = figures["peak_allocations"]
        stats[f"{kind}.all.allocated"] = figures["allocations_total"]
        stats[f"{kind}.all.freed"] = figures["frees_total"]
    stats["reserved_bytes.all.current"] = reserved
    stats["reserved_bytes.all.peak"] = peak_reserved
    return collections.OrderedDict(sorted(stats.items()))


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A table of ``memory_stats()``, laid out as ``torch.cuda.memory_summary``'s."""
    stats = memory_stats(device)

    def size(n: int) -> str:
        for unit in ("B ", "KiB", "MiB", "GiB"):
            if abs(n) < 1024 * 10 or unit == "GiB":
                return f"{n:7d} {unit}"
            n //= 1024
        return f"{n:7d} GiB"

    rows = [("Allocated memory", "allocated_bytes", size), ("Active memory", "active_bytes", size),
            ("Allocations", "allocation", str), ("Active allocs", "active", str)]
    line = "=" * 79
    out = [line, f" torch.tpu memory summary, device: {get_device_name_if_started()}", line,
           f" {'Metric':<24}| {'Cur Usage':>12} | {'Peak Usage':>12} | {'Tot Alloc':>12} | "
           f"{'Tot Freed':>12}", "-" * 79]
    for title, key, fmt in rows:
        cells = [fmt(stats[f"{key}.all.{part}"]) for part in
                 ("current", "peak", "allocated", "freed")]
        out.append(f" {title:<24}| " + " | ".join(f"{c:>12}" for c in cells))
    out.append(f" {'Reserved memory':<24}| {size(stats['reserved_bytes.all.current']):>12} | "
               f"{size(stats['reserved_bytes.all.peak']):>12} | {'':>12} | {'':>12}")
    out.append(line)
    return "\n".join(out) + "\n"


def get_device_name_if_started() -> str:
    from torchtpu_compile.runtime import client
    return get_device_name() if client._make_client.cache_info().currsize else "tpu:0"


def empty_cache() -> None:
    """Nothing to release: PJRT frees a buffer's memory when the buffer dies (no cache of freed
    blocks, unlike CUDA's allocator). Kept so that scripts calling it run unchanged."""


def mem_get_info(device=None) -> tuple:
    """``(free, total)`` bytes of the device: the platform's limit where it reports one, else
    the host memory the PJRT CPU client allocates from."""
    import os
    check_device(device)
    stats = _platform_stats()
    if stats.get("bytes_limit"):
        total = int(stats["bytes_limit"])
        return total - int(stats.get("bytes_in_use", 0)), total
    page = os.sysconf("SC_PAGE_SIZE")
    return page * os.sysconf("SC_AVPHYS_PAGES"), page * os.sysconf("SC_PHYS_PAGES")


def _for_the_allocator(request: str):
    """What the device allocator (``csrc/native.cpp``) asks for ``torch.accelerator``'s memory
    API: ``"stats"`` (``memory_stats()``), ``"memory_info"`` (``mem_get_info()``), or one of
    the resets and ``"empty_cache"``."""
    answer = _ALLOCATOR_REQUESTS.get(request)
    if answer is None:
        raise ValueError(f"torchtpu: the allocator asked for {request!r}")
    return answer()


_ALLOCATOR_REQUESTS = {"stats": memory_stats, "memory_info": mem_get_info,
                       "reset_peak": reset_peak_memory_stats,
                       "reset_accumulated": reset_accumulated_memory_stats,
                       "empty_cache": empty_cache}


def is_bf16_supported() -> bool:
    return True
