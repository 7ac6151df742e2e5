"""Whole models compiled with backend="torchtpu", checked against eager PyTorch on CPU (the
comparison, its tolerances and the training loop are tests/support/model_checks.py)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu_compile
from tests.support import zoo
from tests.support.model_checks import (TOLERANCES, assert_all_close, assert_close,
                                        assert_ran_on_torchtpu, check_inference, check_model,
                                        rel_err, train)

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


# --- small hand-written models ---------------------------------------------------------------

def mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 10))
    return model, (torch.randn(8, 16),)


def cnn():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    return model, (torch.randn(4, 3, 16, 16),)


class Block(nn.Module):
    """Pre-norm transformer block: causal multi-head attention, then an MLP."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


def block():
    torch.manual_seed(0)
    return Block(), (torch.randn(2, 8, 32),)


SMALL = {f.__name__: f for f in (mlp, cnn, block)}


@pytest.mark.parametrize("precision, name", [("highest", n) for n in SMALL] + [("medium", "mlp")],
                         indirect=["precision"])
def test_small_model(precision, name):
    model, inputs = SMALL[name]()
    check_model(name, model, inputs, precision, steps=3)


@pytest.mark.parametrize("precision", ["highest"], indirect=True)
def test_cnn_eval_uses_running_stats(precision):
    model, (x,) = cnn()
    with torch.no_grad():  # non-trivial running statistics, so eval-mode BatchNorm matters
        for _ in range(3):
            model(torch.randn_like(x) * 2 + 1)
    check_inference(model, (x,), precision, TOLERANCES[precision])


def maxpool_cnn():
    torch.manual_seed(0)
    # Overlapping windows: one input element can be the max of two windows, and the
    # gradients sent to it must add up.
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                          nn.Flatten())
    return model, (torch.randn(2, 3, 9, 9),)


@pytest.mark.parametrize("precision", ["highest"], indirect=True)
def test_maxpool_training_matches_eager(precision):
    """max_pool2d's backward runs through our scatter-add decomposition: grads stay exact."""
    model, inputs = maxpool_cnn()
    reference = copy.deepcopy(model)
    actual = train(model, inputs, steps=1, compiled=True)
    expected = train(reference, inputs, steps=1, compiled=False)
    assert_all_close(actual.grads, expected.grads, TOLERANCES[precision]["grad"], "grad")


def test_maxpool_backward_lowers():
    # torch-mlir cannot lower max_pool2d_with_indices_backward; our decomposition must.
    model, inputs = maxpool_cnn()
    train(model, inputs, steps=1, compiled=True)
    assert torchtpu_compile.stats()["fallback_ops"] == {}


def test_precision_modes_on_mlp():
    """"high" is fp32 on CPU; "medium" must round to bf16, visibly more than fp32 does."""
    model, inputs = mlp()
    compiled = torch.compile(model, backend="torchtpu")
    with torch.no_grad():
        expected = model(*inputs)
        errors = {}
        for mode in ("highest", "high", "medium"):
            with torchtpu_compile.config.patch(matmul_precision=mode):
                errors[mode] = rel_err(compiled(*inputs), expected)
    assert_ran_on_torchtpu()
    assert errors["highest"] < 1e-5 and errors["high"] < 1e-5, errors
    assert 1e-4 < errors["medium"] < 3e-2, errors
    assert errors["medium"] > 10 * errors["highest"], errors


# --- transformers models ---------------------------------------------------------------------

#: A decoder and a bidirectional encoder (ViT) in make test; every transformer (Llama and BERT
#: too), with more steps, is in tests/slow/test_models_full.py (at "medium" precision too) and
#: the zoo; tests/test_generate.py decodes with Llama.
FAST_TRANSFORMERS = ("gpt2", "vit")


@pytest.mark.parametrize("precision, name", [("highest", n) for n in FAST_TRANSFORMERS],
                         indirect=["precision"])
def test_transformer(precision, name):
    model, inputs = zoo.TRANSFORMERS[name]()
    check_model(name, model, inputs, precision, steps=3)


# --- detection: deformable attention ---------------------------------------------------------

def test_rt_detr_v2_deformable_attention_and_its_gradients_match_eager():
    """RT-DETR v2's multi-scale deformable attention as transformers writes it: grid_sample
    (bilinear, zero padding, align_corners=False) of 3 levels at learned points, weighted and
    summed. Points outside [0, 1], on pixel centres and on borders; strict, so nothing falls
    back. The whole model (slow) is in tests/slow/test_detection_models.py."""
    from transformers.models.rt_detr_v2.modeling_rt_detr_v2 import \
        multi_scale_deformable_attention_v2 as attention

    from torchtpu_compile import config
    generator = torch.Generator().manual_seed(0)
    shapes, batch, queries, heads, head_dim, points = [(8, 8), (4, 4), (2, 2)], 2, 6, 4, 8, 4
    value = torch.randn(batch, sum(h * w for h, w in shapes), heads, head_dim,
                        generator=generator)
    locations = torch.rand(batch, queries, heads, 3 * points, 2, generator=generator) * 1.4 - 0.2
    locations[:, 0, :, :, 0] = torch.tensor([0.0, 1.0, 0.5 / 8, 7.5 / 8] * 3)  # edges, centres
    weights = torch.randn(batch, queries, heads, 3 * points, generator=generator).softmax(-1)
    cotangent = torch.randn(batch, queries, heads * head_dim, generator=generator)

    def forward(value, locations, weights):
        return attention(value, shapes, locations, weights, [points] * 3)

    def run(fn):
        inputs = [t.clone().requires_grad_() for t in (value, locations, weights)]
        out = fn(*inputs)
        (out * cotangent).sum().backward()
        return out.detach(), {i: t.grad for i, t in enumerate(inputs)}

    with config.patch(strict=True, matmul_precision="highest"):
        actual, actual_grads = run(torch.compile(forward, backend="torchtpu"))
    assert_ran_on_torchtpu()
    expected, expected_grads = run(forward)
    assert_close(actual, expected, TOLERANCES["highest"]["out"], "output")
    assert_all_close(actual_grads, expected_grads, TOLERANCES["highest"]["grad"], "grad")
