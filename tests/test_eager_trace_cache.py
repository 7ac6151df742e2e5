"""The eager device's traced graphs across processes (torchtpu_eager/trace_cache.py): a second
process over the same cache traces nothing it has seen and gives the first one's results; a key
part that changes, or a damaged entry, is a miss, traced again."""
import os

import pytest
import torch

import torchtpu_compile
import torchtpu_eager  # noqa: F401  (registers the device)
from tests.support.warm_workloads import WORKLOADS, cold_then_warm
from torchtpu_compile import config, versions
from torchtpu_compile.lower.index_checks import INDEX_CHECK
from torchtpu_compile.runtime.cache import stores
from torchtpu_eager import trace_cache
from torchtpu_eager.programs import example, trace

f32 = torch.float32


def test_a_second_process_traces_nothing_and_matches_the_first(tmp_path):
    cold, warm = cold_then_warm("eager_device_ops", tmp_path / "cache")
    assert cold["counters"]["eager_traces"] > 10
    assert warm["counters"]["eager_traces"] == 0
    served = warm["counters"]["caches"]["eager_traces"]
    assert served["misses"] == 0 and served["hits"] >= cold["counters"]["eager_traces"] // 2
    expected = WORKLOADS["eager_device_ops"](compiled=False)
    assert cold["results"].keys() == warm["results"].keys() == expected.keys()
    for key, want in expected.items():
        assert torch.equal(warm["results"][key], cold["results"][key]), key
        torch.testing.assert_close(warm["results"][key], want, rtol=1e-5, atol=1e-5,
                                   msg=lambda m, k=key: f"{k}: {m}")


@pytest.fixture
def disk_cache(tmp_path):
    """The trace cache over a disk folder of this test only, its memory level emptied before
    and after; the folder its entries are in."""
    with config.patch(cache_dir=str(tmp_path), cache_key=None, remote_cache=None):
        trace_cache.clear_memory()
        yield tmp_path / "graphs"
        stores.flush_writes()
    trace_cache.clear_memory()


def _traced(what=("test", "add_mul"), shape=(3, 7)):
    """A graph traced (or found) for ``what``; how many traces that took."""
    before = torchtpu_compile.stats()["eager_traces"]
    graph = trace(lambda a, b: (a * 2 + b,), [example(shape, f32), example(shape, f32)],
                  "add_mul", what=what)
    return graph, torchtpu_compile.stats()["eager_traces"] - before


def _as_new_process():
    stores.flush_writes()
    trace_cache.clear_memory()


def test_a_kept_graph_is_the_traced_one(disk_cache):
    first, traces = _traced()
    assert traces == 1
    _as_new_process()
    again, traces = _traced()
    assert traces == 0
    assert again.gm.code == first.gm.code and again.out_meta == first.out_meta
    # The lowering cache keys on the graph's code and every value's metadata: the same key.
    from torchtpu_compile.lower.cache import graph_key
    assert graph_key(again.gm, "cpu", "highest") == graph_key(first.gm, "cpu", "highest")
    a, b = torch.randn(3, 7), torch.randn(3, 7)
    torch.testing.assert_close(again.gm(a, b)[0], a * 2 + b)


def test_a_changed_setting_or_torch_version_is_a_miss(disk_cache, monkeypatch):
    _traced()
    _as_new_process()
    with config.patch(check_indices=not config.check_indices):
        assert _traced()[1] == 1
    _as_new_process()
    monkeypatch.setattr(torch, "__version__", torch.__version__ + ".other")
    versions.stack_versions.cache_clear()
    trace_cache._stack_context.cache_clear()
    try:
        assert _traced()[1] == 1
    finally:
        monkeypatch.undo()
        versions.stack_versions.cache_clear()
        trace_cache._stack_context.cache_clear()
    _as_new_process()
    assert _traced()[1] == 0  # the original entry is still there
    assert _traced(shape=(3, 8))[1] == 1 and _traced(what=("test", "other"))[1] == 1


def test_a_damaged_entry_is_a_miss(disk_cache):
    _traced()
    _as_new_process()
    [entry] = [p for p in disk_cache.iterdir() if p.is_file()]
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    graph, traces = _traced()
    assert traces == 1
    assert torchtpu_compile.stats()["caches"]["eager_traces"]["disk"]["corrupt"] == 1
    a, b = torch.randn(3, 7), torch.randn(3, 7)
    torch.testing.assert_close(graph.gm(a, b)[0], a * 2 + b)


def test_what_cannot_be_told_across_processes_has_no_key():
    examples = [example((2,), f32)]
    assert trace_cache.key_of(("op", torch.ops.aten.add.Tensor, (2.5,)), examples, "add",
                              "cpu") is not None
    assert trace_cache.key_of(("op", lambda: 0), examples, "f", "cpu") is None
    assert trace_cache.key_of(("op", object()), examples, "f", "cpu") is None
    # An op outside aten and prims: a user's custom op may change between processes.
    assert trace_cache.key_of(("op", INDEX_CHECK), examples, "f", "cpu") is None
    # A real tensor among the examples: its values might reach the graph.
    assert trace_cache.key_of(("op",), [torch.empty(2)], "f", "cpu") is None
    # 0.0 and -0.0, 1 and 1.0 and True trace to different graphs.
    keys = {trace_cache.key_of(("op", v), examples, "f", "cpu") for v in (0.0, -0.0, 1, 1.0,
                                                                          True)}
    assert len(keys) == 5


def test_the_cache_off_traces_every_time(disk_cache):
    with config.patch(graph_cache=False):
        assert _traced()[1] == 1
        _as_new_process()
        assert _traced()[1] == 1
    assert not os.path.exists(disk_cache) or not any(p.is_file() for p in disk_cache.iterdir())
