"""The one cache loop (runtime/cache/levels.py): process, then disk, then remote, with one counter
schema for every cache."""
import logging
import os

import pytest
import torch

import torchtpu_compile
import torchtpu_eager  # noqa: F401  (registers the device)
from tests.support.helpers import compile_tpu
from torchtpu_compile import config, counters, graph_cache
from torchtpu_compile.lower import cache as lowering_cache
from torchtpu_compile.runtime import executable
from torchtpu_compile.runtime.cache import Levels, frame, stores


class TextCodec:
    """str values as UTF-8: a payload that is not UTF-8 does not decode."""

    def encode(self, value: str) -> bytes:
        return value.encode()

    def decode(self, payload: bytes) -> str:
        return payload.decode("utf-8")


@pytest.fixture
def text_cache(tmp_path):
    """A cache of strings over a disk folder and a file:// remote of its own; its disk and
    remote folders."""
    with config.patch(cache_dir=str(tmp_path / "disk"), cache_key=None,
                    remote_cache=f"file://{tmp_path / 'remote'}"):
        cache = Levels("test_levels", TextCodec(), folder="texts")
        torchtpu_compile.reset_stats()
        yield cache, tmp_path / "disk" / "texts", tmp_path / "remote" / "texts"
        stores.flush_writes()


def counts(level: str) -> dict:
    return torchtpu_compile.stats()["caches"]["test_levels"][level]


def test_a_value_comes_from_the_fastest_level_that_has_it(text_cache):
    cache, disk, remote = text_cache
    cache.put("k", "value", compute_seconds=2.0)
    stores.flush_writes()
    entry = frame.entry_name("k")
    size = os.path.getsize(disk / entry)
    assert cache.get("k") == "value"                        # this process
    cache.clear_memory()
    assert cache.get("k") == "value"                        # the disk
    cache.clear_memory()
    os.unlink(disk / entry)
    assert cache.get("k") == "value"                        # the remote ...
    assert os.path.getsize(disk / entry) == size            # ... which fills the disk again
    assert cache.get("k") == "value"                        # ... and this process
    assert counts("process") == dict(counts("process"), hits=2, misses=2, seconds_saved=4.0)
    assert counts("disk") == dict(counts("disk"), hits=1, misses=1, bytes_read=size,
                                  bytes_written=2 * size, seconds_saved=2.0)
    assert counts("remote") == dict(counts("remote"), hits=1, misses=0, bytes_read=size,
                                    bytes_written=size)
    whole = counts("all")
    assert (whole["hits"], whole["misses"], whole["bytes_read"], whole["seconds_saved"]) == \
        (4, 0, 2 * size, 8.0)
    assert cache.get("absent") is None
    assert counts("all")["misses"] == 1 and counts("remote")["misses"] == 1


def test_a_payload_that_does_not_decode_is_corrupt_at_its_level_and_discarded(text_cache,
                                                                            caplog):
    cache, disk, remote = text_cache
    cache.put("k", "value")
    stores.flush_writes()
    entry = frame.entry_name("k")
    (disk / entry).write_bytes(frame.pack(b"\xff\xfe not UTF-8", "k"))  # a frame that checks out
    cache.clear_memory()
    with caplog.at_level(logging.WARNING, logger="torchtpu"):
        assert cache.get("k") == "value"  # from the remote, below the damaged disk entry
    assert counts("disk")["corrupt"] == 1 and counts("disk")["hits"] == 0
    assert counts("remote")["hits"] == 1 and counts("all")["corrupt"] == 1
    assert frame.unpack((disk / entry).read_bytes(), "k")[0] == b"value"  # written anew
    assert any("discarding corrupt disk cache entry (test_levels)" in r.getMessage()
               for r in caplog.records)


def test_a_lookup_is_counted_once_the_caller_knows_whether_it_was_of_use(text_cache):
    cache, _, _ = text_cache
    cache.put("k", "value", compute_seconds=1.0)
    cache.clear_memory()
    found = cache.lookup("k")
    assert found.value == "value" and found.level == "disk"
    assert counts("all")["hits"] == counts("all")["misses"] == 0  # nothing counted yet
    cache.count(found, used=False)  # found, but not of use: a miss where it was looked for
    assert counts("process")["misses"] == counts("disk")["misses"] == 1
    assert counts("all")["misses"] == 1 and counts("all")["seconds_saved"] == 0


def test_reject_turns_a_hit_into_a_corrupt_miss_and_forgets_the_entry(text_cache):
    cache, disk, remote = text_cache
    cache.put("k", "value", compute_seconds=1.0)
    stores.flush_writes()
    cache.clear_memory()
    assert cache.get("k") == "value"
    cache.reject("k", "it did not load")
    assert counts("disk") == dict(counts("disk"), hits=0, misses=1, corrupt=1, bytes_read=0,
                                  seconds_saved=0.0)
    assert counts("all")["hits"] == 0 and counts("all")["misses"] == 1
    entry = frame.entry_name("k")
    assert not (disk / entry).exists() and not (remote / entry).exists()
    assert cache.get("k") is None


def test_every_cache_counts_in_one_schema_and_hits_in_this_process(tmp_path):
    f = lambda x: torch.cos(x) * 4 - 1  # noqa: E731
    x = torch.randn(5)
    # The Dynamo-level cache off: it answers before these three (test_dynamo_cache.py's).
    with config.patch(cache_dir=str(tmp_path / "cache"), remote_cache=None, graph_cache=True,
                      dynamo_cache=False):
        for forget in (executable.clear_cache, graph_cache.clear_memory,
                       lowering_cache.clear_memory):
            forget()
        torchtpu_compile.reset_stats()
        expected = compile_tpu(f, dynamic=False)(x)
        torchtpu_compile.reset_stats()
        again = compile_tpu(f, dynamic=False)(x)  # a new Dynamo graph, in the same process
    assert torch.equal(again, expected)
    stats = torchtpu_compile.stats()
    caches = stats["caches"]
    for name in ("executable", "lowering", "aot_autograd"):
        assert set(caches[name]) == {*counters.CACHE_LEVELS, "all"}
        for level in caches[name].values():
            assert set(counters.CACHE_COUNTERS) <= set(level)
        assert caches[name]["process"]["hits"] == caches[name]["all"]["hits"] == 1, name
        assert caches[name]["all"]["misses"] == 0, name
    assert stats["graphs_compiled"] == 0 and stats["lowering_seconds"] == 0
    assert stats["cache_hits"] == 1 and stats["cache_misses"] == 0  # the executable cache's


def test_the_process_level_keeps_the_most_recently_used_entries(text_cache):
    # Values may be compiled programs, each holding native code mappings: a process that kept
    # every one ran out of mappings and crashed (runtime/cache/recent.py).
    cache, _, _ = text_cache
    with config.patch(process_cache_entries=16, cache_dir=None, remote_cache=None):
        for i in range(16):
            cache.put(f"k{i}", f"v{i}")
        assert cache.get("k0") == "v0"   # now the most recently used
        for i in range(16, 40):
            cache.put(f"k{i}", f"v{i}")
            if i < 30:
                cache.get("k0")
        kept = [k for k in (f"k{i}" for i in range(40)) if cache.get(k) is not None]
    assert len(kept) == 16 and "k0" in kept and "k1" not in kept and "k39" in kept


def _mappings() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for _ in maps)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts Linux mappings")
def test_an_eager_loop_over_new_shapes_holds_a_bounded_number_of_programs():
    # Each op's program at each new shape was kept for the life of the process: about 18 code
    # mappings a shape for this loop, until vm.max_map_count (65530) was reached, LLVM failed
    # with "Cannot allocate memory" and the process died in a segmentation fault (a fuzz sweep
    # of the eager device, 124 programs in). Only the most recently used programs stay.
    import gc

    def step(x):
        return ((x * 2 + 1).sin() * 3).sum(0)

    with config.patch(process_cache_entries=32, process_cache_programs=8):
        step(torch.randn(5, 3).to("tpu")).cpu()
        gc.collect()
        before = _mappings()
        for n in range(6, 36):  # unbounded, about 18 new mappings a shape
            x = torch.randn(n, 3)
            torch.testing.assert_close(step(x.to("tpu")).cpu(), step(x))
        gc.collect()
        grown = _mappings() - before
        x = torch.randn(6, 3)  # a shape whose programs were dropped: compiled again
        torch.testing.assert_close(step(x.to("tpu")).cpu(), step(x))
    assert grown < 300, f"{grown} new mappings for 30 shapes"
