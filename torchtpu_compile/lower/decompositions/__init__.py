"""Decompositions applied while aot_autograd traces: torch-mlir's table plus our own.

Ours are registered one per op with ``@decomposition(op)`` and win over torch-mlir's. Checks
registered with ``@checked_first(op)`` see an op's arguments before whichever decomposition it
has (or none): the place for eager's argument errors and edge values. Rules registered with
``@complex_rule(op)`` come next: the op on complex operands, which torch-mlir does not lower.
An op has at most one of each: a second registration raises ``DuplicateRegistration``
(registry.py).

One module per family of ops, as JAX's lax files:

    elementwise       remainder, floor division, fmax/fmin, clamp, hypot, angle, nextafter,
                      frexp, dropout, inductor's fma (optimizers' addcmul_/add_ in Dynamo),
                      bitwise or/xor with a number
    reductions_scans  reductions of 0-d tensors, norm's Scalar overloads,
                      cumsum/cumprod/logcumsumexp/cummax/cummin, histc, histogram
    sorting           stable sort, topk, kthvalue, median, nanmedian, mode, searchsorted
    indexing_scatter  index, index_put, take, put, scatter_reduce, scatter with a reduce,
                      index_reduce, segment_reduce
    views             copies of views, as_strided(_scatter), diagonal(_scatter), unfold, roll,
                      replication padding's backward, view(dtype) between widths and to bool
    pooling           max and average pools (ceil mode, divisors, 3-D, adaptive), backwards
    recurrent         the fused LSTM and GRU cells (nn.LSTM/nn.GRU off the CPU), backwards
    attention         nn.MultiheadAttention's and nn.TransformerEncoderLayer's fused inference
                      kernels (their eval-mode fast path), masked softmax
    resampling        upsampling (output-size overloads, nearest's backward), grid sampler's
                      backward
    convolution       transposed convolutions, convolution_backward
    normalization     batch norm (inference, with update), weight norm's backward
    losses            multilabel margin loss (labels after the first -1, 1-D shapes)
    special           lgamma, digamma, polygamma, zeta, erfc, erfinv, ndtri, erfcx, log_ndtr
    incomplete_gamma  igamma, igammac: eager's series, continued fraction and, for large a
                      near x, Temme's expansion
    bessel            i0, i1 (scaled or not), J, Y, K (scaled or not), spherical j0
    polynomials       Chebyshev (shifted or not), Hermite, Laguerre, Legendre
    linalg            addmv, grouped matmuls, Cholesky/LU/QR/SVD and their solves,
                      cdist/pdist/dist
    fft_complex       FFTs, conj, view_as_real/view_as_complex, complex, polar; the truth
                      value of complex elements (logical ops), complex log10/log2, complex
                      nan_to_num
    casts             casts of complex to bool, and to and from float8 as eager converts
    complex_arithmetic  (``@complex_rule``) complex64 arithmetic, elementwise functions,
                      sums, means, products and matrix products, with eager's promotion of
                      real and Python scalar operands
    foreach           _foreach_* ops, one plain op per list element
    amp               GradScaler's inf check with unscaling, and its scale update
    optimizers        fused Adam/AdamW/SGD steps, per parameter
    checks            (``@checked_first``) reductions over no elements: eager's error or value

Helpers shared between families: common.py (the dtypes a decomposition computes in) and
jax_functions.py (decompositions written as JAX functions: linalg, fft_complex, the
incomplete gammas, polynomials).

Example::

    table = decomposition_table()
    aten.topk.default in table, aten.topk.default in decomposition_table(ours=False)
    # True, False
"""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from .registry import (CHECKS, COMPLEX, OURS, DuplicateRegistration, Registry, checked_first,
                       complex_rule, decomposition, torch_mlir_table)

__all__ = ["CHECKS", "COMPLEX", "OURS", "DuplicateRegistration", "Registry", "checked_first",
           "complex_rule", "decomposition", "decomposition_table", "our_ops",
           "torch_mlir_table"]

aten = torch.ops.aten


def _checked(check, decompose):
    def run(*args, **kwargs):
        result = check(*args, **kwargs)
        if result is not None:
            return result
        return NotImplemented if decompose is None else decompose(*args, **kwargs)
    run.__name__ = f"checked_{getattr(decompose, '__name__', 'op')}"
    return run


def _fresh_results(op, decompose):
    """``decompose``, with any result that is (or views) one of its tensor arguments cloned,
    for an op whose schema returns new memory.

    Where an op is a no-op for some shapes (a scan along a dim of one element, a cast to the
    dtype a tensor has), a decomposition may return its input. Traced by aot_autograd, the
    graph's output then *is* its input, which aot_autograd returns as the caller's tensor
    itself: ``torch.cumsum(x, 0)`` of a (1, n) ``x`` came back as ``x``, and a later write to
    ``x`` changed the result (fuzz seed 1613; eager's result is a new tensor).

    Example::

        fresh = _fresh_results(aten.cumsum.default, lambda x, dim: x)
        fresh(x, 0) is x    # False: a clone
    """
    schema = getattr(op, "_schema", None)
    if schema is None or any(r.alias_info is not None for r in schema.returns):
        return decompose  # a view, an in-place or out= op: its result is an input's memory

    def fresh(*args, **kwargs):
        result = decompose(*args, **kwargs)
        if result is NotImplemented:
            return result
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        return pytree.tree_map_only(
            torch.Tensor, lambda out: out.clone() if _aliases_any(out, inputs) else out, result)
    fresh.__name__ = getattr(decompose, "__name__", "decompose")
    fresh.__wrapped__ = decompose
    return fresh


def _aliases_any(out: torch.Tensor, inputs: list) -> bool:
    return any(out is t or torch._C._is_alias_of(out, t) for t in inputs)


def decomposition_table(ours: bool = True) -> dict:
    """The table given to aot_autograd: torch-mlir's, ours winning.

    With ``ours=False``, torch-mlir's without the ops we decompose: they stay whole, for
    ``numerics.locate`` to check each of our decompositions against eager's op.

    Example::

        table = decomposition_table()
        aten.topk.default in table, aten.topk.default in decomposition_table(ours=False)
        # True, False
    """
    mine = _our_table()
    if not ours:
        return {op: fn for op, fn in torch_mlir_table().items() if op not in mine}
    from ..index_checks import with_index_checks
    table = {**torch_mlir_table(), **mine}
    for op, check in CHECKS.items():
        table[op] = _checked(check, table.get(op))
    table = {op: _fresh_results(op, fn) for op, fn in table.items()}
    # Last: indexing ops mark their indices, then decompose as above (index_checks.py).
    return with_index_checks(table)


def _register_families() -> None:
    # Each family module registers its decompositions (and checks) when imported: here, on
    # first use, not when this package is imported (the backend and numerics import it early).
    from . import (amp, attention, bessel, casts, checks, complex_arithmetic,  # noqa: F401
                   convolution, elementwise, fft_complex, foreach, incomplete_gamma,
                   indexing_scatter, linalg,
                   losses, normalization, optimizers, polynomials, pooling, recurrent,
                   reductions_scans, resampling, sorting, special, views)


def _our_table() -> dict:
    _register_families()
    table = {}
    for op, fn in OURS.items():
        if isinstance(op, str):
            op = _custom_op(op)
            if op is None:  # its library is not loaded: nothing can call it
                continue
        table[op] = _on_the_inputs_device(fn)
    for op, rule in COMPLEX.items():
        # The rule first; the op's own decomposition (ours, else torch-mlir's) for the rest.
        table[op] = _checked(_on_the_inputs_device(rule),
                             table.get(op) or torch_mlir_table().get(op))
    return table


def _on_the_inputs_device(decompose):
    """``decompose`` with the tensors it creates (``torch.arange(n)``, ``torch.zeros(...)``)
    on its inputs' device.

    Our decompositions build index and constant tensors without a ``device=``: CPU by default.
    A graph compiled on tpu tensors is traced with fake tensors on tpu, where such a CPU tensor
    meets a tpu one and tracing fails (the backward of an embedding, through index_put). The
    eager device traces with CPU examples, and the CPU context changes nothing there.
    """
    def on_device(*args, **kwargs):
        device = _device_of(args)
        if device is None:
            return decompose(*args, **kwargs)
        with device:
            return decompose(*args, **kwargs)
    on_device.__name__ = getattr(decompose, "__name__", "decompose")
    on_device.__wrapped__ = decompose
    return on_device


def _device_of(args):
    """The first non-CPU device among ``args``' tensors (lists included), or None."""
    for arg in args:
        for t in (arg if isinstance(arg, (list, tuple)) else (arg,)):
            if isinstance(t, torch.Tensor) and t.device.type != "cpu":
                return t.device
    return None


def our_ops() -> frozenset:
    """The ops we decompose (``@decomposition``), those of libraries not loaded left out.

    Example::

        aten.topk.default in our_ops()   # True
    """
    return frozenset(_our_table())


def _custom_op(qualified_name: str):
    namespace, name = qualified_name.split("::")
    try:
        return getattr(getattr(torch.ops, namespace), name).default
    except (AttributeError, RuntimeError):
        return None
