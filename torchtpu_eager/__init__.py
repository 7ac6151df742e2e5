"""The eager "tpu" device: ``x.to("tpu")``, ``torch.zeros(3, device="tpu")``, ``torch.tpu``.

Importing this package registers the device (PrivateUse1, renamed "tpu"). It is also
autoloaded by PyTorch's ``torch.backends`` entry point, so a plain ``import torch`` is enough.
Registering starts nothing: the PJRT client comes up at the first op.

Example::

    import torch, torchtpu_eager
    model = torch.nn.Linear(4, 2).to("tpu")
    y = model(torch.randn(3, 4, device="tpu"))
    print(y.cpu())
"""
from .device import autoload, register
from .distributed import register as _register_tpu_dist

register()
_register_tpu_dist()  # the "tpu_dist" c10d backend: a name only, nothing starts here

__all__ = ["autoload", "register"]
