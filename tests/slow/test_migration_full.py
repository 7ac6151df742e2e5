"""The migration suite's longer runs (tests/migration/test_scripts.py has the fast ones): each
CUDA-style script on CPU and on tpu, every variant the scripts offer."""
import pytest

from tests.migration import image_classification, transformer_lm
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
