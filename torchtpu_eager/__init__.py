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


def autoload() -> None:
    """Entry point of the ``torch.backends`` group: PyTorch calls it at ``import torch``.

    Defined before anything imports torch: when this package is imported first, ``import torch``
    below runs PyTorch's autoload, which finds this package half-initialized and calls this.
    """
    from .device import autoload as register_at_torch_import
    register_at_torch_import()


import torch  # noqa: E402,F401  (may call autoload() above, see its docstring)

from .device import register  # noqa: E402
from .distributed import register as _register_tpu_dist  # noqa: E402

register()
_register_tpu_dist()  # the "tpu_dist" c10d backend: a name only, nothing starts here

__all__ = ["autoload", "register"]
