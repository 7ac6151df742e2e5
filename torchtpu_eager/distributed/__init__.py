"""tpu_dist: ``torch.distributed`` for tpu tensors (the "nccl" of the tpu device).

Migrating a CUDA script is two renames: ``cuda`` -> ``tpu`` and ``nccl`` -> ``tpu_dist``::

    import torch, torch.distributed as dist
    dist.init_process_group("tpu_dist")          # or "cpu:gloo,tpu:tpu_dist"
    x = torch.ones(4, device="tpu")
    dist.all_reduce(x)                           # x is world_size * ones on every rank

Registering the backend (done when ``torchtpu_eager`` loads) only records its name with
PyTorch; the process group module, jax and the PJRT client load at ``init_process_group``.
"""
from __future__ import annotations

NAME = "tpu_dist"
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
    import torch.distributed as dist
    if not dist.is_available():  # a torch build without distributed: nothing to register
        return
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, devices=["tpu"])
    _registered = True


__all__ = ["NAME", "register"]
