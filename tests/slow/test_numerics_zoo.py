"""compare() passes on every model of the zoo: training at "highest" (outputs and gradients at
float32 tolerance) and inference at "medium" (bf16 matmul emulation, bf16-level tolerance)."""
import pytest

from tests.support import zoo
from torchtpu_compile.numerics import compare

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("precision, train", [("highest", True), ("medium", False)],
                         ids=["train-highest", "inference-medium"])
@pytest.mark.parametrize("name", list(zoo.TRANSFORMERS))
def test_zoo_model_matches_eager(name, precision, train):
    model, inputs = zoo.TRANSFORMERS[name]()
    report = compare(model, inputs, reference="auto", precision=precision, train=train,
                     locate=True)
    assert report.passed, report
    assert report.fallback_ops == {}
    if train:
        assert any(c.name.startswith("grad.") for c in report.checks)
