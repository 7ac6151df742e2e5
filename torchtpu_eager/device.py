"""Registering "tpu" as a PyTorch device: PrivateUse1, renamed, with a Python backend.

This only tells PyTorch the device exists (name, ``torch.tpu`` module, the device guard and
hooks -- native, ``torchtpu_compile/csrc/native.cpp`` -- and kernels for factories). It starts
no PJRT client and imports no jax: that happens at the first op, so the autoload that runs at
``import torch`` costs almost nothing and changes nothing for CPU code.

Example::

    import torchtpu_eager            # or just ``import torch`` with the package installed
    torch.ones(2, device="tpu")
"""
from __future__ import annotations

import sys
import threading

import torch

NAME = "tpu"
_lock = threading.Lock()
_registered = False


def register() -> None:
    """Make "tpu" a device of this process (idempotent).

    Example::

        from torchtpu_eager.device import register
        register()
        assert torch.device("tpu").type == "tpu"
    """
    global _registered
    with _lock:
        if _registered:
            return
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", NAME):
            raise RuntimeError(
                f"cannot register the 'tpu' device: PrivateUse1 is already taken by "
                f"{current!r} in this process (another out-of-tree backend was loaded first)")
        try:
            from torchtpu_compile import _native
        except ImportError as err:
            raise ImportError(
                "torchtpu's native extension (torchtpu_compile/csrc/native.cpp) is not built: "
                "run `make install`, or `pip install --no-build-isolation -e .` in the "
                "checkout, with torch installed first") from err

        from . import (autocast, jagged_attention, kernels, module_conversion, multi_tensor,
                       serialization, streams, tpu_module)
        if current != NAME:
            torch.utils.rename_privateuse1_backend(NAME)
            # Tensor.tpu(), Tensor.is_tpu, Module.tpu(); storages of a Python backend have no
            # data, so no storage methods.
            torch.utils.generate_methods_for_privateuse1_backend(
                for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=False)
        torch._register_device_module(NAME, tpu_module)
        sys.modules[f"torch.{NAME}.amp"] = tpu_module.amp   # from torch.tpu.amp import ...
        # The device guard and hooks, in C++ (csrc/native.cpp): PyTorch calls the guard from
        # noexcept code, where a call into Python aborts the process, and takes the pinned
        # host allocator (pin_memory(), torch.empty(pin_memory=True)) only from C++ hooks.
        # torch.accelerator.synchronize() and torch.Stream's synchronize()/query() reach the
        # device through the guard, which calls back here.
        try:
            _native.register_device(streams.synchronize_device, streams.device_idle)
        except TypeError as err:   # an extension built from an older native.cpp
            raise ImportError(f"torchtpu's native extension is out of date ({err}): rebuild "
                              f"it (`make install`)") from err
        # torch.accelerator's memory API reads a device allocator: one answering with
        # torch.tpu's figures (it allocates nothing; tpu memory is PJRT buffers).
        _native.register_allocator(tpu_module._for_the_allocator)
        kernels.register()
        module_conversion.register()  # Module.to("tpu") keeps tied weights tied
        autocast.register()  # torch.autocast("tpu"): CUDA's op lists (autocast.py)
        serialization.register()
        multi_tensor.register()  # optimizers' foreach=None takes _foreach_* ops, as on CUDA
        jagged_attention.register()  # attention of jagged nested tensors on tpu values
        from . import compile_support, stats  # noqa: F401  (stats: the device's counters)
        compile_support.register_with_runtime()  # compiled programs take and give tpu tensors
        compile_support.route_default_backend()  # torch.compile(model) on tpu: torchtpu
        compile_support.teach_dynamo_at_compile()  # every backend traces tpu tensors
        compile_support.teach_make_fx()  # make_fx records ops on tpu tensors, not our dispatch
        compile_support.teach_higher_order_ops()  # torch.cond, scan, ... run on tpu tensors
        _registered = True
    from . import compile_support
    compile_support.teach_dynamo_if_loaded()


def check_device(device) -> None:
    """Raise, as CUDA does for an invalid device ordinal, for a device other than the process's
    one tpu device (tpu:0); None, "tpu" and an index of -1 are it.

    Example::

        check_device("tpu:0")      # fine
        check_device(1)            # RuntimeError: tpu:1 does not exist: ...
    """
    if device is None:
        return
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != NAME:
            raise ValueError(f"expected a tpu device, got {device}")
        index = device.index
    if index not in (None, 0, -1):
        raise RuntimeError(f"tpu:{index} does not exist: this process drives one device, "
                           f"tpu:0 (torch.tpu.device_count() is 1). Under tpu_dist each "
                           f"rank's own chip is its tpu:0: use 'tpu', not tpu:<local rank>")


def autoload() -> None:
    """Entry point of the ``torch.backends`` group: PyTorch calls it at ``import torch``.

    ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns every such autoload off.
    """
    register()
    register_log_name()


def register_log_name() -> None:
    """Make ``TORCH_LOGS=+torchtpu`` a setting torch accepts (it parses TORCH_LOGS at import,
    right after the autoload, and rejects names it does not know)."""
    try:
        from torch._logging._internal import register_log
        register_log("torchtpu", "torchtpu")
    except Exception:  # a torch without the registry: our own TORCH_LOGS parsing still works
        pass
