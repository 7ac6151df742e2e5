"""The registries of our decompositions and of the checks run before them: one function per op.

``@decomposition(op)`` registers an op's decomposition, ``@checked_first(op)`` the check that
sees its arguments first. A second function for an op raises ``DuplicateRegistration`` when
its module is imported, naming both functions: which one the table would hold must never depend
on the order in which family modules happen to be imported.

Example::

    @decomposition(aten.silu.default)
    def silu(x):
        return x * torch.sigmoid(x)
"""
from __future__ import annotations

import functools
from collections.abc import MutableMapping


class DuplicateRegistration(ValueError):
    """Two functions registered for one op (or one JAX builder kind)."""


class Registry(MutableMapping):
    """op -> function, one function per op.

    ``register`` (the decorators' way in) raises ``DuplicateRegistration`` where the op already
    has another function; item assignment replaces it, as in a dict (tests planting a
    decomposition on purpose).

    Example::

        decompositions = Registry("decomposition")
        decompositions.register(aten.silu.default, silu)
        decompositions.register(aten.silu.default, silu_2)
        # DuplicateRegistration: aten.silu.default has two decompositions: ...silu (file:line)
        # and ...silu_2 (file:line)
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._functions: dict = {}

    def register(self, op, fn) -> None:
        existing = self._functions.get(op)
        if existing is not None and existing is not fn:
            raise DuplicateRegistration(
                f"{op} has two {self.kind}s: {_where(existing)} and {_where(fn)}. An op has "
                f"one {self.kind}: remove one of them, or merge them into one function.")
        self._functions[op] = fn

    def __getitem__(self, op):
        return self._functions[op]

    def __setitem__(self, op, fn) -> None:
        self._functions[op] = fn

    def __delitem__(self, op) -> None:
        del self._functions[op]

    def __iter__(self):
        return iter(self._functions)

    def __len__(self) -> int:
        return len(self._functions)


def _where(fn) -> str:
    code = getattr(fn, "__code__", None)
    place = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__name__', repr(fn))}{place}"


#: Our decompositions (``@decomposition``), the checks run before them (``@checked_first``)
#: and the rules for complex operands (``@complex_rule``).
OURS = Registry("decomposition")
CHECKS = Registry("check")
COMPLEX = Registry("complex rule")


def decomposition(*ops):
    """Register the decorated function as the decomposition of each op in ``ops``.

    An op is an ``OpOverload`` or, for a custom op that its library registers only when
    imported, its ``"namespace::name"`` (default overload), resolved when the table is built.

    Example::

        @decomposition(aten.silu.default)
        def silu(x):
            return x * torch.sigmoid(x)
    """
    def register(fn):
        for op in ops:
            OURS.register(op, fn)
        return fn
    return register


def checked_first(*ops):
    """Register ``check(*args, **kwargs)`` to run before each op's decomposition.

    The check raises eager's error for inputs eager rejects, returns eager's result where the
    decomposition would compute another one, or returns None to decompose as usual. Shapes are
    static here (both paths trace with fake tensors), so it decides on the host.

    Example::

        @checked_first(aten.max.default)
        def max_of_nothing(x):
            if x.numel() == 0:
                raise invalid_input(RuntimeError, "max(): ...")
    """
    def register(fn):
        for op in ops:
            CHECKS.register(op, fn)
        return fn
    return register


def complex_rule(*ops):
    """Register ``rule(*args, **kwargs)`` as each op's computation on complex operands.

    torch-mlir lowers no arithmetic on complex tensors, while most of these ops already have a
    decomposition for real ones: the rule runs before it (after the op's check) and returns
    the result where the op computes in complex64, or None to leave the call to the op's
    decomposition (ours, else torch-mlir's, else none).

    Example::

        @complex_rule(aten.exp.default)
        def exp(x):
            return jax_function("complex_elementwise", "exp")(x) if x.is_complex() else None
    """
    def register(fn):
        for op in ops:
            COMPLEX.register(op, fn)
        return fn
    return register


@functools.cache
def torch_mlir_table() -> dict:
    """torch-mlir's decomposition table, which ours extends.

    Example::

        torch_mlir_table()[aten.addmm.default]   # torch-mlir's decomposition of addmm
    """
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table
    return dict(get_decomposition_table())
