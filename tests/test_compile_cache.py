"""Levels 2 (host disk) and 3 (remote) of the compile cache."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchtpu_compile
from tests.support.helpers import compile_tpu
from torchtpu_compile.runtime import executable
from torchtpu_compile.runtime.cache import frame, stores

# A small training step in a fresh process; prints the compile counters as JSON.
SCRIPT = textwrap.dedent("""\
    import json, torch, torchtpu_compile
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    compiled = torch.compile(model, backend="torchtpu")
    loss = compiled(torch.randn(8, 16)).pow(2).mean()
    loss.backward()
    stats = torchtpu_compile.stats()
    print(json.dumps({"compiled": stats["graphs_compiled"], "hits": stats["cache_hits"],
                      "misses": stats["cache_misses"], "levels": stats["caches"]["executable"],
                      "loss": loss.item()}))
""")


def run_script(cache_dir, remote=None, xla_flags=None):
    env = dict(os.environ, TORCHTPU_CACHE_DIR=str(cache_dir))
    env.pop("TORCHTPU_REMOTE_CACHE", None)
    env.pop("XLA_FLAGS", None)
    if remote:
        env["TORCHTPU_REMOTE_CACHE"] = remote
    if xla_flags:
        env["XLA_FLAGS"] = xla_flags
    code = SCRIPT
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def result_of(proc):
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture
def isolated_cache(tmp_path):
    """This process compiles into an empty disk cache and forgets its level-1 entries (tests
    may set the cache settings further: the patch restores them)."""
    with torchtpu_compile.config.patch(cache_dir=str(tmp_path / "cache"), remote_cache=None):
        executable.clear_cache()
        torchtpu_compile.reset_stats()
        yield tmp_path / "cache"
    executable.clear_cache()


def entries(directory):
    return sorted(p for p in os.listdir(directory) if p.endswith(".xla"))


def test_two_processes_compiling_at_once_leave_valid_entries(tmp_path):
    procs = [run_script(tmp_path / "c"), run_script(tmp_path / "c")]
    results = [result_of(p) for p in procs]
    assert results[0]["loss"] == results[1]["loss"]
    names = entries(tmp_path / "c")
    assert len(names) == max(r["compiled"] for r in results)  # one entry per graph
    for name in names:
        with open(tmp_path / "c" / name, "rb") as f:
            frame.unpack(f.read())  # raises if any entry is torn
    assert not [p for p in os.listdir(tmp_path / "c") if p.startswith(".tmp-")]


def test_an_executable_compiled_under_other_xla_flags_is_never_loaded(tmp_path):
    """XLA_FLAGS shape the code XLA emits (fast math, its scheduler, TPU flags): a process
    running under other flags compiles its own executables, as jax's cache does."""
    flags = "--xla_cpu_multi_thread_eigen=false --xla_cpu_enable_fast_math=false"
    plain = result_of(run_script(tmp_path / "c"))
    flagged = result_of(run_script(tmp_path / "c", xla_flags=flags))
    reordered = result_of(run_script(tmp_path / "c", xla_flags=" ".join(reversed(flags.split()))))
    assert plain["levels"]["disk"]["hits"] == 0
    assert flagged["levels"]["disk"]["hits"] == 0      # not the executables of `plain`
    assert flagged["levels"]["disk"]["misses"] == plain["levels"]["disk"]["misses"] > 0
    assert reordered["levels"]["disk"]["hits"] == flagged["levels"]["disk"]["misses"]
    assert len(entries(tmp_path / "c")) == 2 * plain["levels"]["disk"]["misses"]
    assert flagged["loss"] == plain["loss"]


def test_corrupt_disk_entry_is_discarded_and_recompiled(isolated_cache, caplog):
    f = lambda x: torch.cos(x) * 3 + 1
    x = torch.randn(16)
    expected = compile_tpu(f)(x)
    (name,) = entries(isolated_cache)
    path = isolated_cache / name
    blob = bytearray(path.read_bytes())
    blob[-40] ^= 0xFF  # flip a byte inside the executable
    path.write_bytes(bytes(blob))
    executable.clear_cache()
    torchtpu_compile.reset_stats()
    with caplog.at_level("WARNING", logger="torchtpu"):
        again = compile_tpu(f)(x)
    assert torch.equal(again, expected)
    stats = torchtpu_compile.stats()
    assert stats["caches"]["executable"]["disk"]["corrupt"] == 1
    assert stats["graphs_compiled"] == 1
    assert any("corrupt disk cache entry" in r.getMessage() for r in caplog.records)
    frame.unpack(path.read_bytes())  # replaced by a good entry


def test_truncated_entry_is_rejected():
    blob = frame.pack(b"x" * 100, "key", compile_seconds=1.0)
    with pytest.raises(frame.CorruptEntry):
        frame.unpack(blob[:-1])
    with pytest.raises(frame.CorruptEntry):
        frame.unpack(b"garbage")
    assert frame.unpack(blob)[0] == b"x" * 100


def test_disk_cache_evicts_least_recently_used(tmp_path):
    store = stores.DiskStore(str(tmp_path), max_bytes=2500)
    for i, key in enumerate(("a", "b", "c")):
        store.put(key, b"0" * 1000)
        os.utime(tmp_path / frame.entry_name(key), (1000 + i, 1000 + i))
    # Writing "c" went over the cap: "a", the oldest, was evicted.
    assert store.get("a") is None and store.get("b") is not None and store.get("c") is not None
    os.utime(tmp_path / frame.entry_name("c"), (5000, 5000))
    os.utime(tmp_path / frame.entry_name("b"), (4000, 4000))
    store.put("d", b"0" * 1000)
    assert store.get("b") is None and store.get("c") is not None


def test_disk_cache_lists_its_folder_once_until_it_may_be_full(tmp_path, monkeypatch):
    # Each put listed and stat-ed every entry: over the 100,000 entries of a cache used for
    # weeks, 0.5 s per put, most of every new eager op's first call.
    listings = []
    real_listdir = os.listdir
    monkeypatch.setattr(stores.os, "listdir", lambda d: listings.append(d) or real_listdir(d))
    store = stores.DiskStore(str(tmp_path), max_bytes=100_000)
    for i in range(40):
        store.put(f"k{i}", b"0" * 200)          # 8,000 bytes: under a tenth of the cap
    assert len(listings) == 1
    for i in range(40, 80):
        store.put(f"k{i}", b"0" * 200)          # past a tenth: listed again, once
    assert len(listings) == 2
    assert all(store.get(f"k{i}") is not None for i in range(80))


def test_disk_cache_evicts_below_its_cap_once_full(tmp_path):
    store = stores.DiskStore(str(tmp_path), max_bytes=10_000)
    for i in range(12):
        store.put(f"k{i}", b"0" * 1000)
        os.utime(tmp_path / frame.entry_name(f"k{i}"), (1000 + i, 1000 + i))
    on_disk = sum(f.stat().st_size for f in tmp_path.iterdir() if f.name.endswith(".xla"))
    assert on_disk <= 10_000
    # the newest entries are the ones kept
    assert store.get("k11") is not None and store.get("k0") is None


def test_remote_file_cache_fills_disk_of_a_new_machine(tmp_path, isolated_cache):
    remote = tmp_path / "remote"
    torchtpu_compile.config.remote_cache = f"file://{remote}"
    f = lambda x: torch.tanh(x) * 5
    x = torch.randn(8)
    expected = compile_tpu(f)(x)
    stores.flush_writes()  # writes are behind: wait for them
    assert entries(remote)
    # A "new machine": empty disk and process caches, same remote.
    torchtpu_compile.config.cache_dir = str(tmp_path / "other-disk")
    executable.clear_cache()
    torchtpu_compile.reset_stats()
    assert torch.equal(compile_tpu(f)(x), expected)
    stats = torchtpu_compile.stats()
    assert stats["graphs_compiled"] == 0
    assert stats["caches"]["executable"]["remote"]["hits"] == 1
    assert entries(tmp_path / "other-disk")  # read through to level 2


def test_remote_writes_queued_at_exit_are_written(tmp_path):
    """The remote store writes on a daemon thread; a process that exits right after queueing
    entries still writes every one of them."""
    remote = tmp_path / "remote"
    code = textwrap.dedent(f"""\
        from torchtpu_compile.runtime.cache.stores import RemoteStore
        store = RemoteStore("file://{remote}")
        for i in range(64):
            store.put(f"key-{{i}}", bytes([i]) * (2 << 20))
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    store = stores.RemoteStore(f"file://{remote}")
    assert len(entries(remote)) == 64
    assert all(store.get(f"key-{i}") == bytes([i]) * (2 << 20) for i in range(64))


def test_broken_remote_is_never_fatal(tmp_path, isolated_cache, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the remote directory should be")
    torchtpu_compile.config.remote_cache = f"file://{blocker}"
    with caplog.at_level("WARNING", logger="torchtpu"):
        out = compile_tpu(lambda x: x * 7)(torch.ones(3))
    assert torch.equal(out, torch.full((3,), 7.0))
    assert any("remote compile cache" in r.getMessage() for r in caplog.records)
    torchtpu_compile.config.remote_cache = "nosuchscheme://bucket/dir"
    with caplog.at_level("WARNING", logger="torchtpu"):
        out = compile_tpu(lambda x: x * 9)(torch.ones(3))
    assert torch.equal(out, torch.full((3,), 9.0))
