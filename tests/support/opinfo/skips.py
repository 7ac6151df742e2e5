"""The skip list, as data: OpInfo entry -> (category, reason).

Categories:

- ``xla-unsupported``: XLA cannot express it (data-dependent output shapes, ...);
- ``ours``: a gap of ours (torchtpu or torch-mlir lowering) to fix; stays visible in the
  coverage table and as a named pytest skip;
- ``test-artifact``: the comparison itself is meaningless (random results, uninitialized
  memory, ...), not the op.

An entry applies to every path and dtype (fp32, bf16, complex64 and the integer and bool ones)
unless it names some (``paths``, ``dtypes``). A skip of the eager device's tensors (not of a
mode) names both of its paths, ``ON_DEVICE``.
"""
from __future__ import annotations

from dataclasses import dataclass

CATEGORIES = ("xla-unsupported", "ours", "test-artifact")
#: The paths on the ``tpu`` device: strict mode and defer-and-fuse mode (paths.ON_DEVICE).
ON_DEVICE = ("eager", "fuse")


@dataclass(frozen=True)
class Skip:
    category: str
    reason: str
    paths: tuple = ("compile", *ON_DEVICE)
    dtypes: tuple = ("fp32", "bf16", "c64", "i64", "i32", "u8", "b8")

    def __post_init__(self):
        if self.category not in CATEGORIES:
            raise ValueError(f"skip category {self.category!r}: expected one of {CATEGORIES}")
        if not self.reason:
            raise ValueError("every skip needs a reason")


_UNINITIALIZED = "returns uninitialized memory: eager and compiled contents differ by design"
_RANDOM = ("a random op: the compiled program draws from torch's generator in a different order "
           "than the eager kernel, so values differ by design (shapes and dtypes are checked by "
           "test_calling_conventions' random-op tests)")
_SEEDED = ("OpInfo wraps the op in wrapper_set_seed (freeze_rng_state under no_dispatch), which "
           "Dynamo cannot fake-tensorize; and the values are random anyway")
_JITERATOR = "jiterator ops compile CUDA source at run time; they exist only on CUDA and ROCm"
_ANY_BACKEND = ("fails under torch.compile with any backend (aot_eager too): a PyTorch "
                "limitation, not the lowering")

SKIPS: dict = {
    **{name: Skip("test-artifact", _UNINITIALIZED) for name in (
        "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
        "new_empty_strided")},
    **{name: Skip("test-artifact", _RANDOM) for name in (
        "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "normal",
        "normal.in_place", "normal.number_mean", "uniform", "multinomial", "rand_like",
        "randn_like", "randint_like", "randint", "nn.functional.rrelu")},
    **{name: Skip("test-artifact", _SEEDED) for name in (
        "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
        "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
        "nn.functional.feature_alpha_dropout.without_train",
        "nn.functional.multi_head_attention_forward", "nn.functional.fractional_max_pool2d",
        "nn.functional.fractional_max_pool3d")},
    **{name: Skip("test-artifact", _JITERATOR) for name in (
        "jiterator_unary", "jiterator_binary", "jiterator_4inputs_with_extra_args",
        "jiterator_binary_return_by_ref", "jiterator_2inputs_2outputs")},
    # Its third sample views storage beyond the input view (offset 10 of a 2x2 view);
    # aot_autograd's functionalization rejects that.
    "as_strided.partial_views": Skip("test-artifact", _ANY_BACKEND),
    "chalf": Skip("xla-unsupported", "complex32 (chalf) is not an XLA element type"),
    # The eager tpu device only.
    **{name: Skip("xla-unsupported", "sparse layouts: the tpu device holds dense tensors only",
                  paths=ON_DEVICE) for name in (
        "to_sparse", "sparse.sampled_addmm", "sparse.mm.reduce")},
    "tensor_split": Skip("test-artifact", "its tensor_indices_or_sections argument must be a CPU "
                         "tensor (on CUDA too), and the harness moves every tensor of a sample "
                         "to the device", paths=ON_DEVICE),
    "nn.functional.scaled_dot_product_attention": Skip(
        "test-artifact", "its third sample has dropout_p=0.5: the tpu device draws from its own "
        "generator, independent of the CPU one, so the mask differs by design",
        paths=ON_DEVICE),
    **{name: Skip(
        "test-artifact", "a randomized approximation: its random projection comes from the "
        "tpu device's own generator, independent of the CPU one, so the approximation (singular "
        "values included) differs by design", paths=ON_DEVICE)
       for name in ("svd_lowrank", "pca_lowrank")},
    "topk": Skip("test-artifact", "bf16 and integer samples hold equal values; which of "
                 "their indices topk returns is unspecified (values match)",
                 dtypes=("bf16", "i64", "i32", "u8")),
    **{name: Skip("ours", "the compile path traces PyTorch's float decomposition of the "
                  "uint8 resize (aot_eager's values); eager's kernel resamples in fixed point, "
                  "one axis at a time: up to a third of the pixels one level apart (the device "
                  "runs eager's kernel)", dtypes=("u8",), paths=("compile",)) for name in (
        "nn.functional.interpolate.bilinear", "nn.functional.interpolate.bicubic",
        "nn.functional.upsample_bilinear")},
    "kthvalue": Skip("test-artifact", "integer samples hold equal values; which of their "
                     "indices kthvalue returns is unspecified (values match)",
                     dtypes=("i64", "i32", "u8")),
}


#: The ModuleInfo sweep's skips (modules.py), by ``module_db`` name.
MODULE_SKIPS: dict = {}

#: The error-input sweep's skips (errors.py), by OpInfo entry and by ``module_db`` name.
ERROR_SKIPS: dict = {}
MODULE_ERROR_SKIPS: dict = {}


def lookup(entry: str, path: str, dtype: str, table: dict | None = None) -> Skip | None:
    """The skip for ``entry`` ("op" or "op.variant") on ``path`` and ``dtype`` in ``table``
    (default: the OpInfo skips, ``SKIPS``), if any.

    Example::

        lookup("empty", "compile", "fp32").category   # "test-artifact"
    """
    skip = (SKIPS if table is None else table).get(entry)
    if skip is None or path not in skip.paths or dtype not in skip.dtypes:
        return None
    return skip
