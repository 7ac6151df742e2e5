"""torchtpu's compile path: ``torch.compile(model, backend="torchtpu")``.

Example::

    import torch
    model = torch.nn.Linear(4, 2)
    compiled = torch.compile(model, backend="torchtpu")
    y = compiled(torch.randn(3, 4))

    import torchtpu_compile
    print(torchtpu_compile.stats())

    @torchtpu_compile.jax_op          # a JAX function or Pallas kernel as a PyTorch op
    def scaled(x):
        return x * 2
"""
from . import config
from .counters import reset_stats, stats

__all__ = ["config", "stats", "reset_stats", "backend", "jax_op"]


def __getattr__(name):
    # The backend pulls in torch-mlir and jax; load it only when asked for.
    if name == "backend":
        import importlib
        return importlib.import_module(".backend", __name__)
    if name == "jax_op":
        from .kernels import jax_op
        return jax_op
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
