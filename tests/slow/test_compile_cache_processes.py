"""The executable cache's disk level across two processes, counted level by level.

The fast suite's warm-process test (tests/test_graph_cache.py) runs the same two processes
over a larger model and checks that the second compiles nothing and matches bit for bit; this
one checks the executable cache's own disk counters."""
import pytest

from tests.test_compile_cache import result_of, run_script

pytestmark = pytest.mark.slow


def test_second_process_hits_disk_for_every_graph(tmp_path):
    first = result_of(run_script(tmp_path / "c"))
    assert first["compiled"] >= 2 and first["levels"]["disk"]["hits"] == 0  # forward, backward
    second = result_of(run_script(tmp_path / "c"))
    assert second["compiled"] == 0
    assert second["levels"]["disk"]["hits"] == first["compiled"]
    assert second["levels"]["disk"]["seconds_saved"] > 0
    assert second["loss"] == first["loss"]
