"""Tensor types whose data already lives in PJRT buffers, registered by the device that has them.

The runtime converts torch tensors to PJRT buffers (``transfer.to_buffer``) and results back
(``transfer.wrapper_for``). A device whose tensors wrap PJRT buffers (the eager "tpu" device)
registers here how to read a tensor's buffer and how to wrap a buffer as a tensor: compiled
programs then take and return such tensors with no host round trip, and the runtime imports
nothing of the device. This module imports nothing (no jax): the eager device registers itself
at ``import torch``.

Example::

    register_device_tensor(TpuTensor, read_buffer, "tpu", wrap_buffer)
    READERS[TpuTensor](t)            # t's PJRT buffer
    WRAPPERS["tpu"](buffer)          # a TpuTensor holding buffer
"""
from __future__ import annotations

# Read by ``transfer`` on every conversion (plain dicts: a lookup is all it costs there).
#: tensor type -> (tensor -> its PJRT buffer)
READERS: dict = {}
#: device type -> (PJRT buffer -> a tensor of that device); other devices get host tensors
WRAPPERS: dict = {}


def register_device_tensor(cls, read, device_type: str, wrap) -> None:
    """Let compiled programs take ``cls`` tensors and return tensors of ``device_type``.

    ``read(t)`` gives the PJRT buffer holding ``t``; ``wrap(buffer)`` a new tensor on it.

    Example::

        register_device_tensor(TpuTensor, read_buffer, "tpu", wrap_buffer)
    """
    READERS[cls] = read
    WRAPPERS[device_type] = wrap


#: tensor type -> (private(tensors, args): for each of ``tensors`` (arguments of one call,
#: ``args``), whether nothing else holds its buffer, so that a program may reuse its memory;
#: adopt(t, result): ``t`` now holds the buffer of ``result``, a tensor of the same device)
DONORS: dict = {}
#: the device types of those tensors
DONOR_DEVICES: set = set()


def register_donor(cls, device_type: str, private, adopt) -> None:
    """Let compiled programs that overwrite a ``cls`` input reuse its buffer (donation).

    ``private(tensors, args)`` must say False for a tensor whose buffer anything but the
    tensor (and views sharing its storage) could still read, another argument of the call
    included: a donated buffer is deleted. ``adopt(t, result)`` gives ``t`` the buffer of the
    program's result, the value the program wrote for it.

    Example::

        register_donor(TpuTensor, "tpu", buffers_are_private, take_buffer)
    """
    DONORS[cls] = (private, adopt)
    DONOR_DEVICES.add(device_type)
