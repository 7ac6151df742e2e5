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
from .rng import check_device, get_rng_state, initial_seed, manual_seed, seed, set_rng_state  # noqa: F401

# Read by torch.utils.checkpoint: an initialized device has RNG state to save and restore
# around recomputation (its dropout masks), which the tpu generator always has.
_initialized = True


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
