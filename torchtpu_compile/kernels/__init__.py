"""Custom kernels: JAX functions and Pallas kernels as PyTorch ops (``jax_op``)."""
from .jax_op import JaxOp, graph_fingerprint, jax_op, kernel_of

__all__ = ["JaxOp", "graph_fingerprint", "jax_op", "kernel_of"]
