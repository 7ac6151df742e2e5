"""The migration suite's longer runs (tests/migration/test_scripts.py has the fast ones): each
CUDA-style script on CPU and on tpu, every variant the scripts offer."""
import pytest

import torchtpu_compile
from tests.migration import (autograd_recipes, char_rnn, dcgan, dqn, gcn, image_classification,
                             seq2seq_attention, siamese, spatial_transformer, style_transfer,
                             super_resolution, time_sequence_prediction, transformer_lm, vae,
                             word_language_model)
from tests.migration.test_scripts import TOLERANCE, assert_same, highest_precision  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("amp", ["bfloat16", "float16"])
def test_image_classification_eager(amp):
    want = image_classification.main("cpu", amp=amp)
    got = image_classification.main("tpu", amp=amp)
    assert want["checkpoint_devices"] == got["checkpoint_devices"] == ["cpu"]
    assert_same(got, want, TOLERANCE[amp])


def test_image_classification_compiled(fresh_dynamo):
    want = image_classification.main("cpu", amp="bfloat16", workers=0)
    got = image_classification.main("tpu", amp="bfloat16", compiled=True, workers=0)
    assert_same(got, want, TOLERANCE["bfloat16"])


@pytest.mark.parametrize("optimizer_flag", ["fused", "foreach", "none"])
def test_transformer_lm_compiled(optimizer_flag, fresh_dynamo):
    want = transformer_lm.main("cpu", compiled=False, optimizer_flag=optimizer_flag)
    got = transformer_lm.main("tpu", compiled=True, optimizer_flag=optimizer_flag)
    assert_same(got, want, TOLERANCE["float32"])


def test_transformer_lm_eager_bfloat16():
    want = transformer_lm.main("cpu", compiled=False, dtype="bfloat16", optimizer_flag="none")
    got = transformer_lm.main("tpu", compiled=False, dtype="bfloat16", optimizer_flag="none")
    assert_same(got, want, TOLERANCE["bfloat16"])


# --- PyTorch's tutorials (tests/migration/<tutorial>.py) -------------------------------------
# Each runs on tpu in strict eager mode and in defer-and-fuse, with host fallbacks refused
# (config.strict), and compiled where a script offers it; none of these fits the fast suite's
# 2 s (each compiles 50-120 eager programs on a cold cache).

TUTORIALS = {"seq2seq_attention": seq2seq_attention, "dcgan": dcgan,
             "spatial_transformer": spatial_transformer, "style_transfer": style_transfer,
             "dqn": dqn, "char_rnn": char_rnn, "autograd_recipes": autograd_recipes,
             # pytorch/examples
             "time_sequence_prediction": time_sequence_prediction, "vae": vae,
             "super_resolution": super_resolution, "siamese": siamese, "gcn": gcn,
             "word_language_model": word_language_model}


@pytest.mark.parametrize("name", list(TUTORIALS))
def test_tutorial_eager(name, eager_mode):
    script = TUTORIALS[name]
    want = script.main("cpu")
    with torchtpu_compile.config.patch(strict=True):
        got = script.main("tpu")
    assert_same(got, want, TOLERANCE["float32"])


@pytest.mark.parametrize("name, options", [("dcgan", {}), ("dqn", {}),
                                           # compiled dropout draws eager's distribution,
                                           # not its bits (docs/compile.md)
                                           ("spatial_transformer", {"dropout": 0.0}),
                                           ("super_resolution", {})])
def test_tutorial_compiled(name, options, fresh_dynamo):
    script = TUTORIALS[name]
    want = script.main("cpu", **options)
    with torchtpu_compile.config.patch(strict=True):
        got = script.main("tpu", compiled=True, **options)
    assert_same(got, want, TOLERANCE["float32"])
    assert torchtpu_compile.stats()["graph_breaks"] == {}


def test_word_language_model_transformer(eager_mode):
    # The LSTM variant is in test_tutorial_eager; this one generates with a growing sequence.
    want = word_language_model.main("cpu", "Transformer", words=4)
    with torchtpu_compile.config.patch(strict=True):
        got = word_language_model.main("tpu", "Transformer", words=4)
    assert_same(got, want, TOLERANCE["float32"])
