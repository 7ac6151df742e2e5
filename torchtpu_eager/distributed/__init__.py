"""tpu_dist: ``torch.distributed`` for tpu tensors (the "nccl" of the tpu device).

Migrating a CUDA script is two renames: ``cuda`` -> ``tpu`` and ``nccl`` -> ``tpu_dist``::

    import torch, torch.distributed as dist
    dist.init_process_group("tpu_dist")          # or "cpu:gloo,tpu:tpu_dist"
    x = torch.ones(4, device="tpu")
    dist.all_reduce(x)                           # x is world_size * ones on every rank

Registering the backend (done when ``torchtpu_eager`` loads) only records its name with
PyTorch; the process group module, jax and the PJRT client load at ``init_process_group``.

With no backend named, ``init_process_group()`` gives ``"cpu:gloo,tpu:tpu_dist"`` (``DEFAULT``):
PyTorch would give the detected accelerator's backend alone, and "tpu" is always detected (the
PJRT CPU client stands in for a TPU), so CPU-only programs would get tpu_dist for their CPU
tensors. Mapped both ways, CPU tensors go to PyTorch's own gloo, as before the package was
installed, and tpu tensors to tpu_dist, as ``"cpu:gloo,cuda:nccl"`` does on CUDA.
"""
from __future__ import annotations

NAME = "tpu_dist"
DEFAULT = f"cpu:gloo,tpu:{NAME}"
_registered = False


def _create(store, rank: int, world_size: int, timeout):
    # Imported here, not at registration: registration runs at ``import torch``.
    from .process_group import TpuProcessGroup
    return TpuProcessGroup(store, rank, world_size, timeout)


def register() -> None:
    """Register "tpu_dist" as the c10d backend of device "tpu" (idempotent, cheap).

    Example::

        from torchtpu_eager.distributed import register
        register()
        assert torch.distributed.Backend.default_device_backend_map["tpu"] == "tpu_dist"
    """
    global _registered
    if _registered:
        return
    from . import stats  # noqa: F401  (tpu_dist's counters join torchtpu_compile.stats())
    import torch.distributed as dist
    if not dist.is_available():  # a torch build without distributed: nothing to register
        return
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, devices=["tpu"])
    _default_to_both_devices(dist.distributed_c10d.BackendConfig)
    _registered = True


def _default_to_both_devices(config_class) -> None:
    """Make an unnamed backend mean ``DEFAULT`` when the detected accelerator is tpu (module
    doc). PyTorch resolves the unnamed backend in ``BackendConfig``, with no hook for a
    device to add CPU; its constructor is wrapped, every other case passes through."""
    original = config_class.__init__
    if getattr(original, "_tpu_default", False):
        return

    def __init__(self, backend):
        import torch
        import torch.distributed as dist
        if str(backend) == dist.Backend.UNDEFINED and torch._C._get_accelerator().type == "tpu":
            backend = dist.Backend(DEFAULT)
        original(self, backend)
    __init__._tpu_default = True
    config_class.__init__ = __init__


__all__ = ["DEFAULT", "NAME", "register"]
