"""Decompositions into JAX functions: the builders of the ``jax_op`` each decomposition calls.

ATen ops torch-mlir does not lower that StableHLO has (fft, cholesky, triangular_solve) or JAX
writes for each platform (LU, SVD, QR on LAPACK custom calls on the CPU), and arithmetic on
complex tensors, which torch-mlir does not lower at all, become calls of a ``jax_op``
(kernels/jax_op.py) whose StableHLO JAX writes for the program's platform, spliced into the
program by the one lowering (lower/splice.py): compiled graphs, the eager device and AOT
artifacts run the same code. A family module registers one builder per kind with
``@builds(kind)``; ``jax_function(kind, *params)`` is the ``jax_op`` with the non-tensor
arguments (dims, norm, upper, ...) bound, registered once, on first use.

Example::

    @builds("conj")
    def _conj_fn():
        import jax.numpy as jnp
        return jnp.conj

    jax_function("conj")(z)     # in a decomposition: z's conjugate, computed by JAX
"""
from __future__ import annotations

import ast
import functools

from ...kernels.jax_op import resolves_names
from .registry import Registry


#: kind -> builder(*params) returning the JAX function; one ``@builds`` per kind.
_BUILDERS = Registry("JAX builder")


def builds(kind: str):
    """Register the decorated function as the builder of the JAX function ``kind``: called with
    the parameters given to ``jax_function(kind, *params)``, it returns the function of the
    tensors. A second builder for one kind raises ``DuplicateRegistration``.

    Example::

        @builds("conj")
        def _conj_fn():
            import jax.numpy as jnp
            return jnp.conj
    """
    def register(builder):
        _BUILDERS.register(kind, builder)
        return builder
    return register


@functools.cache
def jax_function(kind: str, *params):
    """The ``jax_op`` computing ``kind`` with ``params`` bound, registered once.

    Example::

        jax_function("fft_c2c", (1,), 0, True)(z)   # unnormalized forward FFT of z over dim 1
    """
    from ...kernels.jax_op import jax_op

    return jax_op(_BUILDERS[kind](*params), name=_op_name(kind, params))


def _op_name(kind: str, params: tuple) -> str:
    """The op's name: readable, and, after ``__p``, its parameters in a form that reads back
    (``_named``), where they are Python literals."""
    name = "aten_" + kind + "".join(f"_{_name_part(p)}" for p in params)
    if params:
        text = repr(params)
        try:
            if ast.literal_eval(text) == params:
                name += "__p" + text.encode().hex()
        except (ValueError, SyntaxError):
            pass
    return name


@resolves_names
def _named(name: str) -> bool:
    """Register the JAX function op ``name`` (``_op_name``'s), which another process made."""
    if not name.startswith("aten_"):
        return False
    from . import _register_families   # the builders register with their families
    _register_families()
    _, encoded, code = name.rpartition("__p")
    try:
        params = ast.literal_eval(bytes.fromhex(code).decode()) if encoded else ()
    except (ValueError, SyntaxError):
        return False
    for kind in _BUILDERS:
        if isinstance(params, tuple) and _op_name(kind, params) == name:
            jax_function(kind, *params)
            return True
    return False


def _name_part(value) -> str:
    if isinstance(value, (tuple, list)):
        return "x".join(str(v) for v in value) or "none"
    return str(int(value)) if isinstance(value, bool) else str(value)
