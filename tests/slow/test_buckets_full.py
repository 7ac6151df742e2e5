"""The issue-4 acceptance runs: 40 random lengths in 1..512, every output against eager, at
most 8 compiles per graph; the encoder with batch and sequence both dynamic; LM training."""
from __future__ import annotations

import copy
import random

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

import torchtpu_compile

from tests.support.dynamic_models import Decoder, Encoder, lm_loss
from tests.support.helpers import compile_tpu
from torchtpu_compile import config

pytestmark = pytest.mark.slow


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def _graphs(kind=None):
    graphs = torchtpu_compile.stats()["graphs"]
    return {name: g for name, g in graphs.items() if kind is None or name.endswith(kind)}


def test_causal_decoder_40_lengths_up_to_512(fresh_dynamo):
    # automatic dynamic: the first length compiles a static graph, the second a symbolic one
    torch.manual_seed(0)
    model = Decoder().eval()
    compiled = compile_tpu(model)
    rng = random.Random(0)
    with config.patch(matmul_precision="highest"), torch.no_grad():
        for _ in range(40):
            ids = torch.randint(0, 64, (2, rng.randint(1, 512)))
            _close(compiled(ids), model(ids))
    graphs = _graphs()
    assert max(g["compiles"] for g in graphs.values()) <= 8, graphs
    assert torchtpu_compile.stats()["buckets"]["exact_shape_compiles"] == 0
    # a static graph for the first length, one bucketed graph for all others (and one for
    # length 1, which Dynamo always specializes): no recompiles inside the bucket range
    assert len(graphs) <= 3


def test_encoder_40_calls_with_dynamic_batch_and_sequence(fresh_dynamo):
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = compile_tpu(model)
    rng = random.Random(2)
    with config.patch(matmul_precision="highest"), torch.no_grad():
        for i in range(40):
            x = torch.randn(rng.randint(2 if i == 0 else 1, 8),
                            rng.randint(2 if i == 0 else 1, 512), 16)
            if i == 0:
                torch._dynamo.mark_dynamic(x, 0)
                torch._dynamo.mark_dynamic(x, 1)
            _close(compiled(x), model(x))
    graphs = _graphs()
    # batch and sequence share one graph (a batch of 1 gets its own: Dynamo specializes 1)
    assert any(len(b) == 2 for g in graphs.values() for b in g["buckets"])
    assert max(g["compiles"] for g in graphs.values()) <= 8, graphs
    assert torchtpu_compile.stats()["buckets"]["exact_shape_compiles"] == 0


def test_lm_training_step_matches_eager(fresh_dynamo):
    torch.manual_seed(0)
    eager = Decoder(layers=1)
    model = copy.deepcopy(eager)

    def step(net, ids):
        loss = lm_loss(net(ids), ids)
        loss.backward()
        return loss

    compiled = compile_tpu(step)
    with config.patch(matmul_precision="highest"):
        for i, length in enumerate((9, 30, 17)):
            ids = torch.randint(0, 64, (2, length))
            if i == 0:
                torch._dynamo.mark_dynamic(ids, 1)
            _close(compiled(model, ids), step(eager, ids))
            for p, q in zip(model.parameters(), eager.parameters()):
                _close(p.grad, q.grad)
                p.grad = q.grad = None
    assert torchtpu_compile.stats()["buckets"]["exact_shape_compiles"] == 0


#: Zoo language models trained at varying lengths, their loss from ``labels``.
TRAINED_AT_MANY_LENGTHS = ("llama", "qwen2", "mistral", "bert", "t5", "gpt_neox", "phi", "opt",
                           "bloom", "falcon", "bart", "gpt2")


@pytest.mark.parametrize("name", TRAINED_AT_MANY_LENGTHS)
def test_a_language_model_trained_at_many_lengths_compiles_per_bucket(name, fresh_dynamo):
    # The loss and every gradient as eager's at each (batch, length), and no graph compiled
    # per shape: Hugging Face's losses shift labels with constant_pad_nd and
    # shift_tokens_right writes a slice (copy), which both did; GPT-2's loss, after a graph
    # break, gets logits and labels whose sizes Dynamo named apart.
    from tests.support import zoo_full
    eager, _ = zoo_full.ZOO[name][1]()

    def inputs(batch, length):
        ids = torch.randint(3, 90, (batch, length))
        labels = ids[:, : max(2, length // 2)].contiguous() if name in ("t5", "bart") \
            else ids
        return dict(input_ids=ids, labels=labels)
    _trains_as_eager_per_bucket(eager, inputs)


def _trains_as_eager_per_bucket(eager, inputs):
    """``eager`` and a compiled copy trained at 5 (batch, length) shapes of ``inputs``: the
    loss and every gradient as eager's, no graph compiled per shape, no op in eager."""
    from tests.support.model_checks import no_dropout
    no_dropout(eager)  # torchtpu draws dropout masks of its own
    model = copy.deepcopy(eager)
    compiled = compile_tpu(model)
    torch.manual_seed(0)
    with config.patch(matmul_precision="highest"):
        for batch, length in ((2, 9), (2, 17), (3, 23), (1, 31), (4, 12)):
            kwargs = inputs(batch, length)
            expected = eager(**kwargs).loss
            actual = compiled(**kwargs).loss
            expected.backward()
            actual.backward()
            torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
            scale = max(p.grad.abs().max() for p in eager.parameters() if p.grad is not None)
            for mine, theirs in zip(model.parameters(), eager.parameters()):
                if theirs.grad is not None:
                    torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4,
                                               atol=1e-5 * scale)
                mine.grad = theirs.grad = None
    stats = torchtpu_compile.stats()
    assert stats["buckets"]["exact_shape_compiles"] == 0, stats["graphs"]
    assert stats["fallback_ops"] == {}  # what the rules emit lowers


@pytest.mark.parametrize("name", ["bert_regression", "bert_question_answering",
                                  "bert_multiple_choice", "bert_token_classification",
                                  "gpt2_sequence_classification", "gpt2_double_heads",
                                  "llama_sequence_classification",
                                  "bart_sequence_classification", "t5_sequence_classification"])
def test_a_task_head_trained_at_many_shapes_compiles_per_bucket(name, fresh_dynamo):
    # Every head but token classification compiled per shape until 2026-12-06: a squeeze of
    # nothing (prims.view_of), an ignore_index that is the length, pooling at the last real
    # token (a scatter into (b * s) rows), (s, 2) against (2 * s), sizes named apart as
    # s - 1 against t - 1, and a runtime assert on sizes after a graph break.
    from tests.support.task_heads import HEADS
    eager, inputs = HEADS[name]()
    _trains_as_eager_per_bucket(eager, inputs)


@pytest.mark.parametrize("name", ["resnet_hf", "convnext", "vit", "deit"])
def test_a_vision_model_trained_at_many_image_sizes_compiles_per_bucket(name, fresh_dynamo):
    # Until 2026-12-06 every one compiled per image size: convolutions over padded height
    # and width; ViT's and DeiT's class tokens before their patches (a cat after a dim that
    # merges padded ones) and their position embeddings interpolated to the grid (a view
    # that splits a padded dim). Swin's forward is bucketed too; its backward at odd image
    # sizes still compiles per shape (docs/coverage.md).
    from tests.support import zoo_full
    eager, _ = zoo_full.ZOO[name][1]()
    patched = name in ("vit", "deit")  # 8-pixel patches, a grid at least 2 x 2
    scale = 2 if patched else 1

    def inputs(batch, size):
        extra = dict(interpolate_pos_encoding=True) if patched else {}
        return dict(pixel_values=torch.randn(batch, 3, scale * size, scale * size + 7 - batch),
                    labels=torch.randint(0, 10, (batch,)), **extra)
    _trains_as_eager_per_bucket(eager, inputs)


@pytest.mark.parametrize("name", ["wav2vec2", "hubert"])
def test_a_speech_model_at_many_audio_lengths_compiles_per_bucket(name, fresh_dynamo):
    from tests.support import zoo_full
    eager, _ = zoo_full.ZOO[name][1]()
    eager.eval()
    compiled = compile_tpu(eager)
    torch.manual_seed(0)
    with config.patch(matmul_precision="highest"), torch.no_grad():
        for length in (400, 517, 733, 640, 999, 1201):
            audio = torch.randn(2, length)
            _close(compiled(audio).logits, eager(audio).logits)
    stats = torchtpu_compile.stats()
    assert stats["buckets"]["exact_shape_compiles"] == 0, stats["graphs"]
    assert stats["fallback_ops"] == {}


# Moved from tests/test_buckets.py to keep `make test` under its budget (the two slowest
# bucket tests there: 140 s and 45 s on a loaded machine).

def _grid_windows(x):
    # Swin's window attention over a (height, width) grid: padded to even sizes, split into
    # 2 x 2 windows (batch and both window counts merged into one dim), put back, cropped
    # where it was padded (a branch Dynamo guards on); then its patch merging.
    b, h, w, c = x.shape
    pad_h, pad_w = (2 - h % 2) % 2, (2 - w % 2) % 2
    y = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    hp, wp = y.shape[1], y.shape[2]
    windows = y.view(b, hp // 2, 2, wp // 2, 2, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, 4, c)
    mixed = windows.softmax(1) * windows.sum(1, keepdim=True)
    back = mixed.view(-1, 2, 2, c).view(b, hp // 2, wp // 2, 2, 2, c)
    back = back.permute(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, c)
    if pad_h > 0 or pad_w > 0:
        back = back[:, :h, :w, :].contiguous()
    out = x + back
    # patch merging: every other row and column, of the grid padded to even sizes again
    z = F.pad(out, (0, 0, 0, pad_w, 0, pad_h))
    merged = torch.cat([z[:, 0::2, 0::2], z[:, 1::2, 1::2]], -1)
    return out.reshape(b, h * w, c).softmax(1), merged.reshape(b, -1, 2 * c).softmax(1)


def test_windows_of_a_grid_padded_to_a_multiple_train_per_bucket(fresh_dynamo):
    # Dynamo spells the window counts as ``X // (X // 2)``-style sizes that sympy does not
    # simplify, equal only under the graph's guards: each image size compiled on its own.
    compiled = compile_tpu(_grid_windows)
    with config.patch(matmul_precision="highest"):
        for i, (h, w) in enumerate(((6, 8), (10, 12), (7, 9), (12, 14), (9, 5))):
            x = torch.randn(2, h, w, 3)
            if i == 0:
                torch._dynamo.mark_dynamic(x, 1)
                torch._dynamo.mark_dynamic(x, 2)
            mine, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
            actual, expected = compiled(mine), _grid_windows(theirs)
            _close(actual, expected)
            sum(a.square().sum() for a in actual).backward()
            sum(e.square().sum() for e in expected).backward()
            _close(mine.grad, theirs.grad)
    stats = torchtpu_compile.stats()
    assert stats["buckets"]["exact_shape_compiles"] == 0 and stats["fallback_ops"] == {}


def test_a_causal_lm_trained_at_several_lengths_compiles_per_bucket(fresh_dynamo):
    # Hugging Face's causal LM loss shifts the labels with ``pad(labels, (0, 1), -100)``: the
    # forward, and so its backward, compiled once per sequence length.
    from tests.support import zoo
    eager, _ = zoo.llama()
    eager.eval()  # no dropout: its draws are not eager's
    model = copy.deepcopy(eager)
    compiled = compile_tpu(model)
    torch.manual_seed(0)
    with config.patch(matmul_precision="highest"):
        for length in (9, 12, 20):  # the first call is static, then buckets 16 and 32
            ids = torch.randint(3, 100, (2, length))
            expected = eager(input_ids=ids, labels=ids).loss
            actual = compiled(input_ids=ids, labels=ids).loss
            expected.backward()
            actual.backward()
            _close(actual, expected)
            for mine, theirs in zip(model.parameters(), eager.parameters()):
                torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-6)
                mine.grad = theirs.grad = None
    stats = torchtpu_compile.stats()
    assert stats["buckets"]["exact_shape_compiles"] == 0
    assert stats["fallback_ops"] == {}  # every bucket's backward runs whole in XLA
    assert [g["buckets"] for g in _graphs("/forward").values() if g["buckets"]] == [[[16], [32]]]
