"""Attention's fused inference kernels (torchtpu_compile/lower/decompositions/attention.py):
nn.MultiheadAttention and nn.TransformerEncoderLayer in eval mode under no_grad take them on the
tpu device, as on the CPU. Each case runs on the eager tpu device and compiled, strict (a host
fallback fails), against the same module on the CPU."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tests.support.decomposition_checks import check_on_both_paths, randn
from tests.support.helpers import compile_tpu
from torchtpu_compile import config

aten = torch.ops.aten

X = randn(2, 5, 16)
PADDING = torch.tensor([[False] * 5, [False, False, False, True, True]])
CAUSAL = torch.ones(5, 5, dtype=torch.bool).triu(1)
# One mask per batch element and head (2 x 4), its first row masking every key: NaN, as on CPU.
PER_HEAD = torch.rand(8, 5, 5, generator=torch.Generator().manual_seed(1)) > 0.6
PER_HEAD[0, 0] = True


def _encoder(**kwargs):
    return nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, **kwargs)


def _attention():
    return nn.MultiheadAttention(16, 4, batch_first=True)


CASES = {
    # name: (module, positional inputs, keyword inputs)
    "encoder layer, padding mask": (_encoder, (X,), {"src_key_padding_mask": PADDING}),
    "encoder layer, norm first, gelu, causal and padding masks": (
        lambda: _encoder(norm_first=True, activation="gelu"), (X,),
        {"src_mask": CAUSAL, "src_key_padding_mask": PADDING}),
    "attention, averaged weights, padding mask": (_attention, (X, X, X),
                                                  {"key_padding_mask": PADDING}),
    "attention, each head's weights, a mask per head": (
        _attention, (X, X, X), {"attn_mask": PER_HEAD, "average_attn_weights": False}),
    "attention without weights, both masks": (
        _attention, (X, X, X),
        {"attn_mask": CAUSAL, "key_padding_mask": PADDING, "need_weights": False}),
}


def _run(make, args, kwargs, device, compiled=False):
    torch.manual_seed(0)
    module = make().eval().to(device)
    if compiled:
        module = compile_tpu(module)
    moved = {}  # one copy per tensor: the fast path needs `query is key is value`

    def move(t):
        if not isinstance(t, torch.Tensor):
            return t
        return moved.setdefault(id(t), t.to(device))
    with torch.no_grad():
        out = module(*map(move, args), **{k: move(v) for k, v in kwargs.items()})
    return torch.utils._pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t,
                                        out)


@pytest.mark.parametrize("name", list(CASES))
def test_fused_attention_inference_matches_the_cpu(name):
    # These ran on the host: on the eager device an upload and a download per layer, compiled
    # the whole encoder layer as one host op in the graph.
    # Compiled: the encoder layers, whose decomposition calls attention's (both paths share
    # the decompositions: one compiled case in the fast suite).
    make, args, kwargs = CASES[name]
    expected = _run(make, args, kwargs, "cpu")
    with config.patch(strict=True, matmul_precision="highest"):
        results = [_run(make, args, kwargs, "tpu")]
        if name == "encoder layer, norm first, gelu, causal and padding masks":
            results.append(_run(make, args, kwargs, "cpu", compiled=True))
    for actual in results:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_a_float_mask_masks_wherever_it_is_nonzero():
    # The fused kernel makes a float mask boolean: 0.5 masks as -inf does (the layers' slow path
    # would add it instead).
    mask = torch.zeros(2, 4, 5, 5)
    mask[:, :, 1, 2], mask[:, :, 3, 0] = 0.5, float("-inf")

    torch.manual_seed(0)
    layer = _attention()
    weights = (layer.in_proj_weight, layer.in_proj_bias, layer.out_proj.weight,
               layer.out_proj.bias)

    def attend(x, mask, qkv_weight, qkv_bias, proj_weight, proj_bias):
        return aten._native_multi_head_attention(x, x, x, 16, 4, qkv_weight, qkv_bias,
                                                 proj_weight, proj_bias, mask, True, True, 2)
    with torch.no_grad():
        check_on_both_paths(attend, X, mask, *(w.detach() for w in weights), rtol=1e-5,
                            atol=1e-5)


@pytest.mark.parametrize("mask_type, mask, dim", [
    (0, CAUSAL, 3),                   # (L, L)
    (1, PADDING, 2),                  # (B, L), softmax over another dim
    (2, PER_HEAD.view(2, 4, 5, 5), 3),  # the scores' shape, a row all masked
])
def test_masked_softmax(mask_type, mask, dim):
    scores = randn(2, 4, 5, 5)
    check_on_both_paths(lambda s, m: torch._masked_softmax(s, m, dim, mask_type), scores, mask,
                        rtol=1e-6, atol=1e-7)


def test_masked_softmax_gradient_on_the_device():
    mask = PER_HEAD.view(2, 4, 5, 5)

    def grad(device):
        scores = randn(2, 4, 5, 5).to(device).requires_grad_()
        out = torch._masked_softmax(scores, mask.to(device), 3, 2)
        (out.nan_to_num() * torch.linspace(-1, 1, 5, device=device)).sum().backward()
        return scores.grad.cpu()
    with config.patch(strict=True, matmul_precision="highest"):
        actual = grad("tpu")
    torch.testing.assert_close(actual, grad("cpu"), rtol=1e-6, atol=1e-7)


def test_a_mask_of_another_shape_raises_as_on_the_cpu():
    scores, mask = randn(2, 4, 5, 5), torch.zeros(2, 1, 5, 5, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="For mask_type == 2 mask shape should match"):
        torch._masked_softmax(scores, mask, 3, 2)
    with config.patch(strict=True), \
            pytest.raises(RuntimeError, match="For mask_type == 2 mask shape should match"):
        torch._masked_softmax(scores.to("tpu"), mask.to("tpu"), 3, 2)


def test_sdpa_result_laid_out_as_eager_for_a_view_of_its_transpose():
    # The SDPA tutorial's CausalSelfAttention: heads split from one projection, attention,
    # y.transpose(1, 2).view(N, L, H * E). The CPU's flash kernel lays its result out as the
    # query, so the view works in eager; the math formulation's contiguous result made
    # aot_autograd raise "Cannot view a tensor ...". Training too: the gradients through it.
    def block(x, w):
        q, k, v = (t.view(2, 5, 4, 4).transpose(1, 2) for t in (x @ w).chunk(3, -1))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        flat = y.transpose(1, 2).view(2, 5, 16)
        return flat, y, torch.autograd.grad(flat.square().sum(), (x, w))

    x, w = X.clone().requires_grad_(), randn(16, 48, seed=2).div(4).requires_grad_()
    with config.patch(strict=True, matmul_precision="highest"):
        actual = compile_tpu(block)(x, w)
    expected = block(x, w)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    assert actual[1].stride() == expected[1].stride()


@pytest.mark.parametrize("mask", ["bool", "float"])
def test_a_mask_with_is_causal_is_merged_as_eagers_cpu_kernel_does(mask):
    # Eager's CPU kernel takes attn_mask and is_causal=True together (the mask and the causal
    # mask both apply); the math formulation both paths run refused the pair.
    q, k, v = randn(1, 2, 3, 4), randn(1, 2, 5, 4, seed=1), randn(1, 2, 5, 4, seed=2)
    m = randn(3, 5, seed=3) > 0 if mask == "bool" else randn(3, 5, seed=3)
    m[:, 0] = True if mask == "bool" else m[:, 0]   # no row fully masked
    q.requires_grad_()

    def attend(q, k, v, m):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m,
                                                               is_causal=True)
        return out.detach(), torch.autograd.grad(out.sum(), q)[0]
    check_on_both_paths(attend, q, k, v, m, rtol=1e-5, atol=1e-5)
