"""Warm start on more user code (tests/test_warm_start.py has the fast representative): each
workload of tests/support/warm_workloads.py in a cold process, then a warm one over the same
cache; the warm results equal the cold ones bit for bit and both match eager CPU."""
import pytest
import torch

from tests.support.warm_workloads import check_cold_warm_eager

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", [
    "adam_onecycle",            # beta1 cycled: b3cac02's warm bug
    "nadam_onecycle",
    "nadam_cosine",
    "radam_cosine",             # RAdam's rectification switches on at step 6
    "hf_llama_adamw_linear_warmup",
    "hf_llama_greedy_generate",
])
def test_workload_warm_as_cold_and_as_eager(name, tmp_path):
    check_cold_warm_eager(name, tmp_path / "cache")


def test_dropout_train_eval_warm_as_cold(tmp_path):
    # train() and eval() run different graphs: a warm process must pick each mode's
    cold, _ = check_cold_warm_eager("dropout_train_eval", tmp_path / "cache")
    linear = cold["results"]["linear"]
    for key, got in cold["results"].items():
        if key.endswith("_train"):   # as eager's dropout: 0 or the value / (1 - p)
            kept = got != 0
            assert 0 < kept.float().mean() < 1, key
            torch.testing.assert_close(got[kept], linear[kept] / 0.5)
