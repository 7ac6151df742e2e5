"""``torch.tpu``: the device module, as ``torch.cuda`` is for CUDA.

Example::

    import torch
    torch.tpu.is_available()          # True: the PJRT CPU client stands in without a TPU
    torch.tpu.manual_seed(0)
    x = torch.randn(3, device="tpu")
    torch.tpu.synchronize()
    torch.tpu.memory_allocated()      # bytes held by live tpu tensors
    with torch.tpu.stream(torch.tpu.Stream()):   # streams: ordered no-ops (streams.py)
        y = x * 2
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import storage as _storage
from .modes import get_eager_mode, set_eager_mode  # noqa: F401  (part of the module API)
from . import streams as _streams
from .streams import (Event, Stream, StreamContext, current_stream, default_stream,  # noqa: F401
                      set_stream, stream)
from .rng import get_rng_state, initial_seed, manual_seed, seed, set_rng_state  # noqa: F401


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return 1  # one PJRT device per process; more chips are more processes (tpu_dist)


def current_device() -> int:
    return 0


def set_device(device) -> None:
    index = torch.device("tpu", device).index if isinstance(device, int) else \
        torch.device(device).index
    if index not in (None, 0):
        raise ValueError(f"tpu:{index} does not exist: this process drives one device, tpu:0")


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


def get_device_properties(device=None) -> DeviceProperties:
    client = _client()
    stats = None
    try:
        stats = client.device.memory_stats()
    except Exception:  # the CPU client has none
        pass
    total = int((stats or {}).get("bytes_limit", 0))
    if not total:
        import os
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return DeviceProperties(get_device_name(), client.platform, client.device.device_kind, total)


def memory_allocated(device=None) -> int:
    return _storage.memory_allocated()


def max_memory_allocated(device=None) -> int:
    return _storage.max_memory_allocated()


def reset_peak_memory_stats(device=None) -> None:
    _storage.reset_peak_memory_stats()


def is_bf16_supported() -> bool:
    return True
