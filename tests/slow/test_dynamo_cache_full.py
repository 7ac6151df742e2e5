"""The Dynamo-level cache, the rest of its safety checks (each a fresh process over a filled
cache): a changed module global, a changed input dtype, a damaged entry, another tensor method
held by a module."""
import shutil

import pytest

from tests import test_dynamo_cache as fast

pytestmark = pytest.mark.slow

#: The fast module's fixture: a cache filled once for this module (module scope).
filled = fast.filled


@pytest.mark.parametrize("change", [
    {"scale": 3.0},                 # a module global the trace baked in (EQUALS_MATCH)
    {"dtype": "float64"},           # the input's and parameters' dtype (TENSOR_MATCH)
], ids=["global", "dtype"])
def test_a_changed_dependency_misses_and_recompiles(filled, tmp_path, change):
    fast.check_changed_dependency_misses(filled, tmp_path, **change)


def test_a_corrupted_entry_is_discarded_and_traced_again(filled, tmp_path):
    root, cache_dir, cold, _ = filled
    own = tmp_path / "cache"
    shutil.copytree(cache_dir, own)
    result = fast.run(own, root / "model", corrupt=True)
    if result["digest"] != cold["digest"]:
        pytest.skip("torchtpu's sources changed since the cache was filled")
    assert result["dynamo"]["corrupt"] == 1 and result["dynamo"]["frames_loaded"] == 0
    assert result["traced"] >= 1
    fast.check_correct(result)


def test_a_frame_holding_another_tensor_method_in_a_module_misses(tmp_path):
    fast.check_frame_holding_another_tensor_method_misses(tmp_path, "module")
