"""The one PJRT client of this process, chosen once.

Example::

    from torchtpu_compile.runtime.client import get_client
    client = get_client()
    print(client.platform)      # "cpu" on a machine with no accelerator
"""
from __future__ import annotations

import functools
import os
import threading

from .. import config
from .._logging import log
from ..errors import PlatformError

#: Our names for PJRT platforms, best first, and the name jax registers each under.
PLATFORMS = {"tpu": "tpu", "cuda": "cuda", "cpu": "cpu"}

_lock = threading.Lock()

#: The process that started the client (empty until then).
_started_in: list = []


class Client:
    """The PJRT client plus the one device we run on (device 0 of the platform)."""

    def __init__(self, platform: str, pjrt_client):
        self.platform = platform
        self.pjrt = pjrt_client
        self.device = pjrt_client.local_devices()[0]
        from jaxlib import _jax
        self.device_list = _jax.DeviceList((self.device,))
        self.compile_flags = xla_flags()

    def __repr__(self) -> str:
        return f"Client(platform={self.platform!r}, device={self.device})"


def xla_flags() -> str:
    """The XLA flags that shape compiled code, as XLA read them (``XLA_FLAGS`` and libtpu's
    ``LIBTPU_INIT_ARGS``, read once per process when the client starts): part of the
    executable cache's key, as in jax's, so that an executable compiled under other flags
    (``--xla_cpu_enable_fast_math``, a TPU scheduler flag) is never loaded. Dump flags change
    no code and are left out.

    Example::

        xla_flags()      # "" with neither variable set; "--xla_cpu_enable_fast_math=true"
    """
    flags = " ".join(os.environ.get(name, "") for name in ("XLA_FLAGS", "LIBTPU_INIT_ARGS"))
    flags = flags.split()
    return " ".join(sorted(f for f in flags if not f.startswith("--xla_dump")))


def _jax_backend(platform: str):
    import jax
    from jax.extend import backend as jax_backend
    # jax reads its flag once, when it makes its CPU client (along with every other platform's,
    # at the first backend asked for): set it for that moment only, so the user's jax
    # configuration reads as they left it.
    name = "jax_cpu_enable_async_dispatch"
    before = jax.config.values[name]
    jax.config.update(name, config.cpu_dispatch == "async")
    try:
        return jax_backend.get_backend(PLATFORMS[platform])
    finally:
        jax.config.update(name, before)


@functools.cache
def _make_client(requested: str | None) -> Client:
    if requested is not None:
        name = requested.strip().lower()
        if name not in PLATFORMS:
            raise PlatformError(
                f"TORCHTPU_PLATFORM={requested!r} is not a platform torchtpu knows; "
                f"use one of: {', '.join(PLATFORMS)} (or leave it unset for the best one present)")
        try:
            client = Client(name, _jax_backend(name))
        except Exception as exc:  # jax says "Unknown backend" or fails to start the plugin
            raise PlatformError(
                f"PJRT platform {name!r} was requested but cannot be started here: {exc}. "
                f"For 'tpu' install torchtpu[tpu] on a TPU host; for 'cuda' install jax's CUDA "
                f"plugin; 'cpu' always works.") from exc
        log.info("torchtpu: using PJRT platform %s (%s)", name, client.device)
        return client
    for name in PLATFORMS:
        try:
            client = Client(name, _jax_backend(name))
        except Exception:
            continue
        if name == "cpu":
            log.info("torchtpu: no accelerator found; using the PJRT CPU client")
        else:
            log.info("torchtpu: using PJRT platform %s (%s)", name, client.device)
        return client
    raise PlatformError("no PJRT platform could be started, not even the CPU client")


def get_client() -> Client:
    """The process-wide PJRT client, created on first use from ``config.platform``.

    Raises in a child forked after the parent started it, as CUDA does: PJRT's threads do
    not survive a fork, and a compile in the child hung for good (a DataLoader worker that
    moved a batch to the device)."""
    if _started_in and _started_in[0] != os.getpid():
        raise PlatformError(
            "Cannot re-initialize tpu in forked subprocess: the parent started the device's "
            "runtime (PJRT), which a forked child cannot use. To use tpu with multiprocessing, "
            "use the 'spawn' start method (torch.multiprocessing.set_start_method('spawn'), "
            "or DataLoader(..., multiprocessing_context='spawn')).")
    with _lock:
        client = _make_client(config.platform)
        if not _started_in:
            _started_in.append(os.getpid())
        return client
