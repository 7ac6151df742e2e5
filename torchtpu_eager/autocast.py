"""``torch.autocast("tpu", dtype=...)``: CUDA's op lists and cast policies on the tpu device.

PyTorch registers autocast kernels in C++ for the devices it ships (``autocast_mode.cpp``); for
PrivateUse1 the ``AutocastPrivateUse1`` dispatch key has none, so any op under
``torch.autocast("tpu")`` failed ("Could not run 'aten::matmul' with arguments from the
'Autocasttpu' backend"). Here are the same lists and policies as CUDA's (torch 2.13's
``autocast_mode.h``), one registry entry per op, and a fallthrough for every other op. Casts
are ordinary ``Tensor.to`` calls above autograd, so gradients flow back in the parameters'
dtype, and compiled graphs (``torch.compile(backend="torchtpu")``) trace the same casts.

The cast cache is CUDA's too (``cached_cast``): a float32 leaf that requires grad (a weight)
is cast to the autocast dtype once per autocast region, however many ops use it; the cache is
dropped when the outermost region exits and not used while ``torch.is_autocast_cache_enabled()``
is false (``make_fx`` turns it off while tracing).

Example::

    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = model(x)              # matmuls and convolutions in bfloat16
        loss = F.cross_entropy(y, t)   # softmax, norms and losses in float32
"""
from __future__ import annotations

import weakref

import torch

_KEY = "AutocastPrivateUse1"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_libraries: list = []

# Run in the autocast dtype (CUDA's lower_precision_fp list).
LOWER_PRECISION_FP = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot",
    "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)
# Run in float32.
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
    "pow.Scalar", "softplus", "layer_norm", "native_layer_norm", "rms_norm", "group_norm",
    "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist",
    "pdist", "cdist", "renorm", "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d",
    "upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d",
    "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
)
# Reductions that take a dtype: computed in float32 unless the caller gave one.
FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
)
# norm without a dtype: redispatched to its overload with one, float32.
FP32_APPEND_DTYPE = {
    "norm.Scalar": "ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "ScalarOpt_dim_dtype",
}
# Several floating inputs: all cast to the widest of them.
PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
    "index_put", "tensordot", "scatter_add",
)
BANNED = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
        "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
        "In this case, combine the two layers using torch.nn.functional."
        "binary_cross_entropy_with_logits\nor torch.nn.BCEWithLogitsLoss.  "
        "binary_cross_entropy_with_logits and BCEWithLogits are\nsafe to autocast."),
}


def _overload(name: str):
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _eligible(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "tpu" \
        and value.is_floating_point() and value.dtype != torch.float64


# id(weight) -> (weakref to the weight, its cast): CUDA's autocast cache (autocast_mode.cpp's
# cached_cast), cleared by torch.clear_autocast_cache, which torch.autocast's __exit__ calls when
# the outermost region ends.
_cast_cache: dict = {}
_tpu_tensor = []  # [TpuTensor], imported at the first cast (registration must not load it)


def _cached_cast(value, dtype):
    """``value.to(dtype)``, once per autocast region for a weight: a float32 leaf that
    requires grad and is a real tpu tensor (not a tracer's fake or functional one), outside
    inference mode, as CUDA's ``cached_cast`` decides (its ``can_try_cache``)."""
    if not _tpu_tensor:
        from .tensor import TpuTensor
        _tpu_tensor.append(TpuTensor)
    if (value.dtype is torch.float32 and value.requires_grad and value.is_leaf
            and type(value) is _tpu_tensor[0] and not value._is_view()
            and torch.is_autocast_cache_enabled() and not torch.is_inference_mode_enabled()):
        key = id(value)
        entry = _cast_cache.get(key)
        if entry is not None and entry[0]() is value:
            return entry[1]
        cast = value.to(dtype)
        _cast_cache[key] = (weakref.ref(value), cast)
        return cast
    return value.to(dtype)


def _cast(value, dtype, cache=False):
    if _eligible(value):
        if value.dtype == dtype:
            return value
        return _cached_cast(value, dtype) if cache else value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype, cache) for v in value)
    return value


def clear_cast_cache() -> None:
    """Forget every cached cast (what leaving the outermost autocast region does).

    Example::

        clear_cast_cache()      # also done by torch.clear_autocast_cache()
    """
    _cast_cache.clear()


def _clear_with_torch() -> None:
    # torch.autocast.__exit__ calls torch.clear_autocast_cache() (by attribute, at exit) when
    # the outermost region ends: the one place PyTorch says a region is over, so the tpu cache
    # is cleared there too. The C++ cache is cleared as before.
    original = torch.clear_autocast_cache
    if getattr(original, "_clears_tpu_casts", False):
        return

    def clear_autocast_cache():
        clear_cast_cache()
        return original()

    clear_autocast_cache.__doc__ = original.__doc__
    clear_autocast_cache._clears_tpu_casts = True
    torch.clear_autocast_cache = clear_autocast_cache


def _run(op, args, kwargs):
    with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
        return op(*args, **kwargs)


def _cast_all(op, dtype_of, cache=False):
    def kernel(*args, **kwargs):
        dtype = dtype_of(args, kwargs)
        return _run(op, _cast(args, dtype, cache),
                    {k: _cast(v, dtype, cache) for k, v in kwargs.items()})
    return kernel


def _autocast_dtype(args, kwargs):
    return torch.get_autocast_dtype("tpu")


def _float32(args, kwargs):
    return torch.float32


def _widest(args, kwargs):
    # CUDA's promote_type: from the autocast dtype, float32 wins, float64 is left alone.
    widest = torch.get_autocast_dtype("tpu")
    for value in (*args, *kwargs.values()):
        for t in value if isinstance(value, (list, tuple)) else (value,):
            if _eligible(t) and t.dtype != widest:
                widest = torch.float32
    return widest


def _set_opt_dtype(op):
    position = [a.name for a in op._schema.arguments].index("dtype")

    def kernel(*args, **kwargs):
        if _eligible(args[0]):
            if len(args) > position:
                if args[position] is None:
                    args = (*args[:position], torch.float32, *args[position + 1:])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
        return _run(op, args, kwargs)
    return kernel


def _append_dtype(with_dtype):
    def kernel(*args, **kwargs):
        dtype = torch.float32 if _eligible(args[0]) else args[0].dtype
        return _run(with_dtype, (*args, dtype), kwargs)
    return kernel


def _banned(message):
    def kernel(*args, **kwargs):
        raise RuntimeError(message)
    return kernel


def kernels() -> dict:
    """Each op's autocast kernel, by ``"name.overload"``."""
    table = {}
    for name in LOWER_PRECISION_FP:
        table[name] = _cast_all(_overload(name), _autocast_dtype, cache=True)
    for name in FP32:
        table[name] = _cast_all(_overload(name), _float32)
    for name in FP32_SET_OPT_DTYPE:
        table[name] = _set_opt_dtype(_overload(name))
    for name, overload in FP32_APPEND_DTYPE.items():
        table[name] = _append_dtype(getattr(torch.ops.aten.norm, overload))
    for name in PROMOTE:
        table[name] = _cast_all(_overload(name), _widest)
    for name, message in BANNED.items():
        table[name] = _banned(message)
    return table


def register() -> None:
    """Install the autocast kernels (called once, by ``device.register``)."""
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, _KEY)
    aten = torch.library.Library("aten", "IMPL")
    for name, kernel in kernels().items():
        aten.impl(name, kernel, _KEY)
    _libraries.extend([fallthrough, aten])
    _clear_with_torch()
