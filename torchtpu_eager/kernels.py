"""PrivateUse1 kernels: what runs when an op reaches the "tpu" backend key itself.

Ops with a tpu tensor argument go to ``TpuTensor.__torch_dispatch__``. The rest reach the
backend key: factories (``torch.zeros(3, device="tpu")``) and the copy that ``torch.tensor``
makes with Python dispatch turned off. Factories of new storage make it uninitialized (read
as zeros, never uploaded); other factories run on the host and upload their result.

Example::

    torch.arange(5, device="tpu")      # arange.start_step: computed on the host, uploaded
"""
from __future__ import annotations

import functools

import torch

_CPU = torch.device("cpu")
_libraries: list = []   # registrations live as long as their Library object

# Composite factories that would otherwise resize an empty out= tensor, which a tpu tensor
# cannot do, or reach a kernel with only CPU and CUDA entries (kaiser_window's stub raised
# an internal assert): served whole instead.
_WHOLE_FACTORIES = (
    "arange", "arange.start", "arange.start_step", "linspace", "logspace", "eye", "eye.m",
    "randperm", "range", "range.step", "tril_indices", "triu_indices", "kaiser_window",
    "kaiser_window.periodic", "kaiser_window.beta",
)


def _on_host(op, args, kwargs):
    from . import rng
    from .device import check_device
    from .transfer import from_cpu
    if _cpu_op_given_tpu_generator(kwargs, args):
        # A tpu generator's dispatch key sent a CPU op (torch.randn(3, generator=g)) here:
        # run as it is (below this key), CPU's kernel refuses the generator as it refuses a
        # CUDA one ("Expected a 'cpu' device type for generator but found 'tpu'").
        return op(*args, **kwargs)
    kwargs = dict(kwargs)
    if "device" in kwargs:
        check_device(kwargs["device"])   # tpu:1 and up do not exist
        kwargs["device"] = _CPU
    with rng.drawing_on_host(op, args, kwargs) as (op, host_args, host_kwargs):
        out = op(*host_args, **host_kwargs)
    return from_cpu(out) if isinstance(out, torch.Tensor) else out


def _cpu_op_given_tpu_generator(kwargs, args) -> bool:
    device = kwargs.get("device")
    return (device is None or device.type != "tpu") and any(
        type(v) is torch.Generator and v.device.type == "tpu"
        for v in (*args, *kwargs.values()))


def _backend_fallback(op, *args, **kwargs):
    from .dispatch import dispatch
    from .tensor import TpuTensor
    if any(type(a) is TpuTensor for a in args):
        return dispatch(op, args, kwargs)
    if any(isinstance(a, torch.Tensor) and a.device.type == "tpu" for a in args):
        # (running it on the host came back here, until Python's recursion limit)
        raise foreign_tensor_error(op)
    return _on_host(op, args, kwargs)


def foreign_tensor_error(op) -> RuntimeError:
    """The error for a tensor on the tpu device that is not a ``TpuTensor``: a DLPack import
    of a tpu tensor's capsule, which holds no device buffer.

    Example::

        raise foreign_tensor_error(torch.ops.aten.mul.Tensor)
    """
    return RuntimeError(
        f"tpu: {op} got a tensor on the tpu device that torchtpu did not make (a DLPack import "
        f"of a tpu tensor?); it has no device memory behind it. Export the tensor with .cpu() "
        f"first, or keep the tpu tensor itself.")


def _dispatching(op):
    """``op``'s kernel at the backend key: our dispatcher, as the boxed fallback would be."""
    def kernel(*args, **kwargs):
        # Imported at the first call: registration runs at ``import torch`` and must not load
        # the dispatcher (and the compile stack behind it).
        from .dispatch import dispatch
        return dispatch(op, args, kwargs)
    return kernel


def _read_scalar(t):
    # Reached with Python dispatch off (torch.tensor([x]) reading its elements). Reading x may
    # run defer-and-fuse mode's pending recording, whose program is traced with fake tensors:
    # with the Python key off they were real, uninitialized tensors, and the lowering failed
    # on their values. The read runs with the keys a top-level call has.
    from .dispatch import dispatch
    from .programs import _top_level_keys
    with torch._C._ForceDispatchKeyGuard(*_top_level_keys()):
        return dispatch(torch.ops.aten._local_scalar_dense.default, (t,), {})


def _copy(dst, src, non_blocking=False):
    from .dispatch import dispatch
    return dispatch(torch.ops.aten.copy_.default, (dst, src), {"non_blocking": non_blocking})


def _ctc_loss_host_lengths(log_probs, targets, input_lengths, target_lengths, blank=0,
                           reduction=1, zero_infinity=False):
    # ctc_loss's Tensor overload, given tensor subclasses (tpu tensors are), divides the loss by
    # target_lengths itself; CUDA scripts keep the lengths on the host (cuDNN wants them
    # there), so they join the loss on its device first.
    device = log_probs.device
    return torch.ops.aten.ctc_loss.Tensor.decompose(
        log_probs, targets, input_lengths.to(device), target_lengths.to(device), blank,
        reduction, zero_infinity)


def one_hot_checked(values, num_classes=-1):
    """``F.one_hot`` on the device, its class values checked as eager's CPU kernel does.

    PyTorch checks them on the CPU only (a device relies on its kernel's assert): on the
    device a value out of range gave a row of zeros where eager raises. It is checked as an
    index is, read at the next synchronization (no wait here), with eager's message.
    ``num_classes=-1`` is the C++ kernel's (it reads the values on the host for the size).
    """
    from torchtpu_compile.lower.index_checks import INDEX_CHECK
    if num_classes == -1 and values.numel() and values.dtype == torch.int64:
        # The size from the largest value, read on the host as eager's kernel reads it; then
        # checked as below (a negative value gave a row of zeros where eager raises).
        num_classes = max(int(values.max()) + 1, 1)
    if num_classes > 0 and values.numel() and values.dtype == torch.int64:
        values = INDEX_CHECK(values, num_classes, values.dim(), False, "aten.one_hot")
    return torch.ops.aten.one_hot.default._op_dk(
        torch._C.DispatchKey.CompositeImplicitAutograd, values, num_classes)


def attention_in_eager_layout(query, key, value, attn_mask=None, dropout_p=0.0,
                               is_causal=False, *, scale=None, enable_gqa=False):
    """``F.scaled_dot_product_attention`` laid out as eager's CPU kernels lay it out.

    The CPU's flash kernel returns its result laid out as the query (``empty_like``); the
    device runs the math formulation, whose result is contiguous: with q, k, v transposed
    from (N, L, H, E), the SDPA tutorial's ``y.transpose(1, 2).view(N, L, H * E)`` raised
    "view size is not compatible" where eager works. The compile path does the same from
    Dynamo's example value (``torchtpu_compile.backend._attention_in_eager_layout``).
    """
    from torchtpu_compile.lower.decompositions.attention import causal_mask_merged
    mask, causal = causal_mask_merged(query, key, attn_mask, is_causal)  # as eager's CPU kernel
    out = torch.ops.aten.scaled_dot_product_attention.default.decompose(
        query, key, value, mask, dropout_p, causal, scale=scale, enable_gqa=enable_gqa)
    order = _eager_attention_order(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                   enable_gqa)
    if order is None:
        return out
    inverse = tuple(order.index(d) for d in range(out.dim()))
    return out.permute(order).contiguous().permute(inverse)


_FLASH = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)


def _eager_attention_order(query, key, value, attn_mask, dropout_p, is_causal, scale,
                           enable_gqa):
    """The memory order (``output_slots.memory_order``) of eager's result on CPU tensors of
    these geometries, or None where it is contiguous (the math formulation's) or the sizes
    are symbolic.

    The CPU's own choice decides, on uninitialized host tensors (no values are read), under
    the caller's grad mode and ``sdpa_kernel`` settings, as eager's call would."""
    tensors = [t for t in (query, key, value, attn_mask) if t is not None]
    if any(type(s) is not int for t in tensors for s in (*t.shape, *t.stride())):
        return None
    geometry = tuple(None if t is None else (tuple(t.shape), t.stride(), t.dtype,
                                             t.requires_grad)
                     for t in (query, key, value, attn_mask))
    return _cpu_attention_order(geometry, dropout_p, is_causal, scale, enable_gqa,
                                torch.is_grad_enabled(), _sdp_flags())


def _sdp_flags() -> tuple:
    # what sdpa_kernel(...) and torch.backends.cuda.enable_*_sdp set, which the choice reads
    c = torch._C
    return (c._get_flash_sdp_enabled(), c._get_mem_efficient_sdp_enabled(),
            c._get_math_sdp_enabled(), c._get_cudnn_sdp_enabled(),
            torch.are_deterministic_algorithms_enabled())


@functools.lru_cache(maxsize=1024)  # per call of every attention layer: host allocations
def _cpu_attention_order(geometry, dropout_p, is_causal, scale, enable_gqa, grad, flags):
    from torchtpu_compile.output_slots import memory_order
    from torch.utils._python_dispatch import _disable_current_modes
    # Dynamo's fake tensors trace here too: real host ones. Made requiring grad by the factory,
    # not requires_grad_(), which torch.func's transforms refuse (grad over a model with
    # attention raised "requires_grad_() inside of a function being transformed").
    with _disable_current_modes(), torch.set_grad_enabled(grad):
        host = [None if g is None else torch.empty_strided(
            g[0], g[1], dtype=g[2], requires_grad=g[3]) for g in geometry]
        choice = torch._fused_sdp_choice(*host, dropout_p, is_causal, scale=scale,
                                         enable_gqa=enable_gqa)
        return memory_order(torch.empty_like(host[0])) if choice == _FLASH else None


def _shaped_like_first(first, *args, **kwargs):
    return torch.empty(first.shape, dtype=first.dtype, device=first.device)


#: Ops with no meta kernel: a fake tensor computes their shape by running them on real zeros
#: with dispatch turned off, which a tpu tensor cannot serve (PyTorch's internal assert "func
#: != nullptr"): torch.compile of a Beta's or Dirichlet's rsample, a Binomial's sample, or a
#: Gamma's rsample backward on tpu tensors raised it. Each result is shaped as the first
#: argument, as the CPU kernels make it.
_SHAPED_LIKE_FIRST = ("_sample_dirichlet", "binomial", "_dirichlet_grad", "_standard_gamma_grad")


def _like_first_with_mask(first, *args, **kwargs):
    return _shaped_like_first(first), torch.empty(first.shape, dtype=torch.bool,
                                                  device=first.device)


def _shaped_like_first_three(first, second, third, *args, **kwargs):
    return tuple(_shaped_like_first(t) for t in (first, second, third))


#: Quantization-aware training's fake-quantize ops, CPU and CUDA kernels only, the same way:
#: torch.compile of a FakeQuantize or LearnableFakeQuantize model on tpu tensors raised
#: "func != nullptr". Shaped as their CPU kernels make them: (the input's shape, its mask),
#: a learnable op's result, and its backward's gradients shaped as input, scale, zero point.
_FAKE_QUANTIZE_METAS = {
    "fake_quantize_per_tensor_affine_cachemask": _like_first_with_mask,
    "_fake_quantize_per_tensor_affine_cachemask_tensor_qparams": _like_first_with_mask,
    "fake_quantize_per_channel_affine_cachemask": _like_first_with_mask,
    "_fake_quantize_learnable_per_tensor_affine": _shaped_like_first,
    "_fake_quantize_learnable_per_channel_affine": _shaped_like_first,
    "_fake_quantize_learnable_per_tensor_affine_backward": lambda grad, x, scale, zero, *a:
        _shaped_like_first_three(x, scale, zero),
    "_fake_quantize_learnable_per_channel_affine_backward": lambda grad, x, scale, zero, *a:
        _shaped_like_first_three(x, scale, zero),
}


#: nn.GRUCell (and nn.GRU) off the CPU call CUDA's fused cell, whose ops have no meta kernel
#: (the LSTM's have): torch.compile of a GRUCell on tpu tensors raised "func != nullptr". Our
#: decompositions compute the shapes (the workspace's too) on meta tensors.
_GRU_CELL_OPS = ("_thnn_fused_gru_cell", "_thnn_fused_gru_cell_backward")


def _gru_cell_meta(name):
    def kernel(*args, **kwargs):
        # Imported when first traced: registering at ``import torch`` stays light.
        from torchtpu_compile.lower.decompositions import recurrent
        fn = {"_thnn_fused_gru_cell": recurrent.fused_gru_cell,
              "_thnn_fused_gru_cell_backward": recurrent.fused_gru_cell_backward}[name]
        return fn(*args, **kwargs)
    return kernel


def _zeros_for_zerotensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    # Forward AD and functorch (jacfwd, hessian, a dual through layer_norm) make the tangents
    # of constants as ZeroTensors; the host's could not be uploaded ("Cannot convert a
    # ZeroTensor to numpy"). Real zeros have the same values: ZeroTensor only saves work.
    return torch.zeros(size, dtype=dtype, layout=layout, device=device)


def _whole_factory(name):
    op = _op_named(name)

    def kernel(*args, **kwargs):
        return _on_host(op, args, kwargs)
    return kernel


# CPU-only quantization helpers whose device-generic (CompositeImplicit) kernels read their
# input through data_ptr(), which on a tpu tensor is no memory of its values (garbage back,
# or a crash): run on host copies. FBGEMM's packed weights are CPU objects: refused.
_READ_ON_HOST = ("choose_qparams_optimized", "fbgemm_linear_quantize_weight")
_FBGEMM_PACKED = ("fbgemm_pack_quantized_matrix", "fbgemm_pack_quantized_matrix.KN",
                  "fbgemm_pack_gemm_matrix_fp16", "fbgemm_linear_fp16_weight",
                  "fbgemm_linear_fp16_weight_fp32_activation", "fbgemm_linear_int8_weight",
                  "fbgemm_linear_int8_weight_fp32_activation")


def _op_named(name: str):
    packet_name, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet_name), overload or "default")


def _read_on_host(name):
    op = _op_named(name)

    def kernel(*args, **kwargs):
        from .fallback import run_on_host
        return run_on_host(op, args, kwargs, reason="its kernel reads the tensor's memory on "
                                                    "the CPU")
    return kernel


def _saturate_weight_to_fp16(weight):
    # CPU's kernel clamps its argument to float16's range in place (its schema says it writes
    # nothing) and returns it.
    with torch.no_grad():
        return weight.clamp_(-65504.0, 65504.0)


def _fbgemm_refused(name):
    def kernel(*args, **kwargs):
        raise RuntimeError(
            f"tpu: aten.{name} works on FBGEMM's packed weights, CPU objects: run it on CPU "
            f"tensors (as on CUDA, where FBGEMM is not available either)")
    return kernel


def register() -> None:
    """Install the kernels (called once, by ``device.register``)."""
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_backend_fallback, "PrivateUse1")
    aten = torch.library.Library("aten", "IMPL")
    # A boxed Python fallback cannot serve copy_ (an internal assert in PyTorch 2.13).
    aten.impl("copy_", _copy, "PrivateUse1")
    for name in _WHOLE_FACTORIES:
        aten.impl(name, _whole_factory(name), "PrivateUse1")
    # Factories of new storage, as their own kernels: the boxed fallback raises an internal
    # assert when a dispatch mode is on the stack with the Python key excluded, which is how
    # torch.tensor(..., device="tpu") makes its real tensor under FakeTensorMode (Dynamo).
    for op in (torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default):
        aten.impl(op._schema.name.split("::")[1] + (op._overloadname != "default") * (
            "." + op._overloadname), _dispatching(op), "PrivateUse1")
    # The same assert met float(x) of a 0-dim tpu tensor inside torch.tensor([x]) (Python
    # dispatch off while it reads its elements): actor-critic's torch.tensor([R]) with R an
    # element of a tpu tensor raised it where CPU and CUDA build the tensor.
    aten.impl("_local_scalar_dense", _read_scalar, "PrivateUse1")
    aten.impl("_efficientzerotensor", _zeros_for_zerotensor, "PrivateUse1")
    aten.impl("ctc_loss.Tensor", _ctc_loss_host_lengths, "AutogradPrivateUse1")
    aten.impl("one_hot", one_hot_checked, "AutogradPrivateUse1")
    aten.impl("scaled_dot_product_attention", attention_in_eager_layout, "AutogradPrivateUse1")
    for name in _SHAPED_LIKE_FIRST:
        aten.impl(name, _shaped_like_first, "Meta")
    for name in _GRU_CELL_OPS:
        aten.impl(name, _gru_cell_meta(name), "Meta")
    for name, meta in _FAKE_QUANTIZE_METAS.items():
        aten.impl(name, meta, "Meta")
    for name in _READ_ON_HOST:
        aten.impl(name, _read_on_host(name), "AutogradPrivateUse1")
    aten.impl("_saturate_weight_to_fp16", _saturate_weight_to_fp16, "AutogradPrivateUse1")
    from .sync_batch_norm import KERNELS as sync_batch_norm
    for name, kernel in sync_batch_norm.items():  # CUDA-only ops nn.SyncBatchNorm calls
        aten.impl(name, kernel, "AutogradPrivateUse1")
    for name in _FBGEMM_PACKED:
        aten.impl(name, _fbgemm_refused(name), "AutogradPrivateUse1")
    _libraries.extend([fallback, aten])
