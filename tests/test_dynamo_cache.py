"""The Dynamo-level cache (on by default): a second process skips Dynamo's tracing, and never
runs a stale trace."""
import ast
import importlib.util
import inspect
import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import types

import pytest
import torch

import torchtpu_compile
from tests.support import python_env
from torchtpu_compile import dynamo_cache, versions

# A model whose forward reads a module global (SCALE) and inlines a module function (helper),
# so that either can change between processes. It indexes with a tensor, so its graph calls
# our own index-check op, which must exist before a cached graph loads.
MODEL = textwrap.dedent("""\
    import torch
    SCALE = {scale}
    def helper(x):
        return x * {factor}
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.register_buffer("cols", torch.tensor([0, 2, 5, 7, 1, 3, 4, 6]))
        def forward(self, x):
            return helper(torch.relu(self.lin(x)))[:, self.cols] + SCALE
""")

# In a fresh process: compile Tiny, call it, compare with eager; optionally damage the frame's
# Dynamo-cache entry first, and call again with another batch size after.
SCRIPT = textwrap.dedent("""\
    import json, os, sys, torch, torchtpu_compile
    sys.path.insert(0, {model_dir!r})
    import tiny_model
    from torchtpu_compile import dynamo_cache, versions
    from torchtpu_compile.runtime.cache import frame
    if {corrupt!r}:
        key = dynamo_cache.frame_key(tiny_model.Tiny.forward.__code__)
        path = os.path.join({cache_dir!r}, "graphs", frame.entry_name(key))
        blob = bytearray(open(path, "rb").read())
        blob[len(blob) // 2] ^= 0xFF
        open(path, "wb").write(bytes(blob))
    torch.set_float32_matmul_precision("highest")  # fp32 matmuls, as eager's
    torch.manual_seed(0)
    dtype = getattr(torch, {dtype!r})
    model = tiny_model.Tiny().to(dtype)
    x = torch.randn(4, 8, dtype=dtype)
    compiled = torch.compile(model, backend="torchtpu")
    with torch.no_grad():
        out, ref = compiled(x), model(x)
        traced = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        first = dict(torchtpu_compile.stats()["caches"]["dynamo"]["all"])
        x5 = torch.randn(5, 8, dtype=dtype)
        reshaped = (compiled(x5) - model(x5)).abs().max().item()
    print(json.dumps({{
        "digest": versions.source_digest(*dynamo_cache._KEYED_SOURCES),
        "out": out.flatten().tolist(), "diff": (out - ref).abs().max().item(),
        "traced": traced, "reshaped_diff": reshaped, "dynamo": first,
        "dynamo_after": torchtpu_compile.stats()["caches"]["dynamo"]["all"]}}))
""")


def run(cache_dir, model_dir, scale=1.0, factor=2.0, dtype="float32", corrupt=False) -> dict:
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "tiny_model.py"), "w") as f:
        f.write(MODEL.format(scale=scale, factor=factor))
    env = dict(os.environ, TORCHTPU_CACHE_DIR=str(cache_dir),
               PYTHONDONTWRITEBYTECODE="1")  # an edited model must not come from a stale .pyc
    # Default settings: the cache is on unless told otherwise.
    for name in ("TORCHTPU_REMOTE_CACHE", "TORCHTPU_GRAPH_CACHE", "TORCHTPU_DYNAMO_CACHE"):
        env.pop(name, None)
    code = SCRIPT.format(model_dir=str(model_dir), cache_dir=str(cache_dir), dtype=dtype,
                         corrupt=corrupt)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_correct(result: dict) -> None:
    """Whatever the cache did, the outputs are eager's (same float math, XLA's CPU kernels)."""
    assert result["diff"] <= 1e-5 and result["reshaped_diff"] <= 1e-5, result


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A cache dir filled by one cold process, and that process's result.

    Others may edit torchtpu's sources meanwhile; an edit changes every key, so a cold/warm pair
    whose sources differ is run again.
    """
    root = tmp_path_factory.mktemp("dynamo_cache")
    for attempt in range(3):
        cache_dir = root / f"cache-{attempt}"
        cold = run(cache_dir, root / "model")
        warm = run(cache_dir, root / "model")
        if cold["digest"] == warm["digest"]:
            return root, cache_dir, cold, warm
    pytest.skip("torchtpu's sources kept changing between the two processes")


def test_second_process_skips_tracing_and_matches_eager(filled):
    _, _, cold, warm = filled
    assert cold["traced"] >= 1 and cold["dynamo"]["bypasses"] == 0
    assert cold["dynamo"]["bytes_written"] > 0
    # The batch-5 call recompiles with a symbolic batch size: not cached, and said so.
    assert cold["dynamo_after"]["bypasses"] == 1
    # It found the batch-4 entry, whose guards fail: a miss, not a hit that saved time.
    assert cold["dynamo_after"]["hits"] == 0 and cold["dynamo_after"]["seconds_saved"] == 0
    check_correct(cold)
    assert warm["dynamo"]["frames_loaded"] >= 1 and warm["dynamo"]["entries_rejected"] == 0
    assert warm["dynamo"]["hits"] == warm["dynamo"]["frames_loaded"]
    assert warm["dynamo"]["seconds_saved"] > 0 and warm["dynamo"]["bytes_read"] > 0
    assert warm["traced"] == 0  # Dynamo traced nothing before the first call returned
    assert warm["out"] == cold["out"]  # bit for bit: the same graph, the same executable
    check_correct(warm)  # and a new batch size after the loaded entry: traced, still correct


def test_an_edited_inlined_function_misses_and_recompiles(filled, tmp_path):
    check_changed_dependency_misses(filled, tmp_path, factor=5.0)


def check_changed_dependency_misses(filled, tmp_path, **change) -> None:
    """Over a copy of the filled cache, a run with ``change`` finds the frame's entry, refuses
    it, traces again and matches eager."""
    root, cache_dir, cold, _ = filled
    own = tmp_path / "cache"
    shutil.copytree(cache_dir, own)
    result = run(own, root / "model", **change)
    if result["digest"] != cold["digest"]:
        pytest.skip("torchtpu's sources changed since the cache was filled")
    assert result["dynamo"]["frames_loaded"] == 0, result["dynamo"]
    assert result["dynamo"]["entries_rejected"] >= 1  # found, checked and refused
    assert result["traced"] >= 1
    check_correct(result)


def test_fingerprints_name_what_a_guard_read():
    def f(x):
        return x + 1

    def g(x):
        return x + 2

    assert dynamo_cache.code_digest(f.__code__) == dynamo_cache.code_digest(
        types.FunctionType(f.__code__.replace(), {}).__code__)
    assert dynamo_cache.code_digest(f.__code__) != dynamo_cache.code_digest(g.__code__)
    assert dynamo_cache._identity(torch.nn) == ("module", "torch.nn")
    assert dynamo_cache._identity(torch.nn.Linear)[:3] == ("class", "torch.nn.modules.linear",
                                                           "Linear")
    # A class is its methods too: a subclass overriding forward is not its parent.
    assert dynamo_cache._identity(type("Linear", (torch.nn.Linear,), {"forward": f}))[3] != \
        dynamo_cache._identity(torch.nn.Linear)[3]
    assert dynamo_cache._describe((1, 2.0, "a", None, torch.float32)) == \
        dynamo_cache._describe((1, 2.0, "a", None, torch.float32))
    assert dynamo_cache._describe(2.0) != dynamo_cache._describe(2)
    with pytest.raises(dynamo_cache.Unportable):
        dynamo_cache._identity(torch.nn.Linear(2, 2))  # an instance: only its id names it
    with pytest.raises(dynamo_cache.Unportable):
        dynamo_cache._identity([].append)  # a builtin bound to an instance


def _imported_modules(module) -> set:
    """Every torchtpu_compile module ``module`` imports, at import time or inside a function."""
    package = module.__name__.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0]
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def test_the_backend_hooks_in_what_never_imports_it_back():
    """backend.py installs the Dynamo-level cache and the graph-break report for its function;
    neither imports backend.py (both did, inside a function: an import cycle)."""
    from torchtpu_compile import backend, graph_breaks
    assert "torchtpu_compile.dynamo_cache" in _imported_modules(backend)
    for module in (dynamo_cache, graph_breaks):
        assert "torchtpu_compile.backend" not in _imported_modules(module), module.__name__


# --- in one process: a module imported again under another name is the same code with fresh
# globals, which is what a second process finds.

FRAMES = textwrap.dedent("""\
    import torch
    def step(x, w):
        return torch.relu(x @ w) * 2.0 + 1.0
    class Scaled(torch.nn.Module):
        def __init__(self, factor):
            super().__init__()
            self.factor = factor
            self.lin = torch.nn.Linear(8, 8)
        def forward(self, x):
            return self.lin(x) * self.factor
""")


_imports = itertools.count()  # a module name per test


@pytest.fixture
def fresh_step(tmp_path, fresh_dynamo):
    """A function returning a newly imported ``step`` of one source file, compiled, after
    Dynamo forgot everything (this cache's level 1 and the graph cache keep their entries).
    Each import replaces the last under the same module name, as in a new process."""
    path = tmp_path / "frames.py"
    path.write_text(FRAMES)
    name = f"dynamo_cache_frames_{next(_imports)}"

    def compiled_step(factor=None):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        torch._dynamo.reset()
        torchtpu_compile.reset_stats()
        if factor is not None:  # the module, its attribute set to factor
            torch.manual_seed(0)
            eager = module.Scaled(factor)
            return torch.compile(eager, backend="torchtpu"), eager
        return torch.compile(module.step, backend="torchtpu"), module.step

    dynamo_cache.clear_memory()
    with torchtpu_compile.config.patch(matmul_precision="highest"):  # eager's fp32 matmuls
        yield compiled_step
    dynamo_cache.clear_memory()
    sys.modules.pop(name, None)


def _call(compiled_step, *args, factor=None) -> dict:
    """Call a fresh compile of ``step`` (with ``factor``: of a ``Scaled(factor)``); what the
    Dynamo cache and Dynamo did, and whether the result is eager's."""
    compiled, eager = compiled_step(factor)
    traced = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch.no_grad():
        out = compiled(*args)
        torch.testing.assert_close(out, eager(*args), rtol=1e-5, atol=1e-5)
    counts = dict(torchtpu_compile.stats()["caches"]["dynamo"]["all"])
    counts["traced"] = torch._dynamo.utils.counters["stats"]["unique_graphs"] - traced
    return counts


def test_on_by_default_and_a_fresh_import_skips_tracing(fresh_step):
    assert dynamo_cache.enabled()  # the default configuration (no TORCHTPU_DYNAMO_CACHE)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    first = _call(fresh_step, x, w)
    assert first["traced"] == 1 and first["frames_loaded"] == 0
    assert first["bytes_written"] > 0
    again = _call(fresh_step, x, w)
    assert again["frames_loaded"] == 1 and again["hits"] == 1 and again["traced"] == 0


def test_other_shapes_miss_and_trace_again(fresh_step):
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    _call(fresh_step, x, w)
    other = _call(fresh_step, torch.randn(3, 8), w)
    assert other["frames_loaded"] == 0 and other["entries_rejected"] == 1
    assert other["hits"] == 0 and other["traced"] == 1
    wider = _call(fresh_step, x, torch.randn(8, 16))
    assert wider["frames_loaded"] == 0 and wider["traced"] == 1


def test_another_module_attribute_misses(fresh_step):
    x = torch.randn(4, 8)
    _call(fresh_step, x, factor=2.0)
    same = _call(fresh_step, x, factor=2.0)
    assert same["frames_loaded"] == 1 and same["traced"] == 0
    other = _call(fresh_step, x, factor=3.0)  # the result checked against eager's x * 3
    assert other["frames_loaded"] == 0 and other["entries_rejected"] == 1
    assert other["traced"] == 1


def test_another_torch_version_string_misses(fresh_step, monkeypatch):
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    _call(fresh_step, x, w)
    stack = versions.stack_versions()
    monkeypatch.setattr(versions, "stack_versions",
                        lambda: stack.replace(f"torch-{torch.__version__}", "torch-2.13.1"))
    other = _call(fresh_step, x, w)
    assert other["frames_loaded"] == 0 and other["hits"] == 0 and other["traced"] == 1
    assert other["misses"] == 1  # looked up under another key: nothing there


def test_an_untested_torch_release_turns_it_off(fresh_step, monkeypatch):
    assert dynamo_cache.supported_torch() is None  # the pinned torch
    assert dynamo_cache.supported_torch("2.13.0+cpu") is None
    reason = dynamo_cache.supported_torch("2.14.0")
    assert reason is not None and "2.14.0" in reason
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    _call(fresh_step, x, w)
    monkeypatch.setattr(torch, "__version__", "2.14.0")
    dynamo_cache.supported_torch.cache_clear()
    try:
        assert not dynamo_cache.enabled()
        off = _call(fresh_step, x, w)
    finally:
        monkeypatch.undo()
        dynamo_cache.supported_torch.cache_clear()
    assert off["traced"] == 1 and off["frames_loaded"] == 0
    assert off["hits"] == off["misses"] == 0  # not even looked up


def test_another_grad_mode_misses_without_a_warning(fresh_step, caplog):
    # An entry stored with grad enabled, looked up under no_grad: Dynamo's guard builder
    # asserts that the global state it guards matches the frame; that is a miss like any
    # other, not a damaged entry ("This is a bug" was logged as a warning before).
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    compiled, _ = fresh_step()
    with torch.enable_grad():
        compiled(x, w)
    with caplog.at_level(logging.INFO, logger="torchtpu"):
        other = _call(fresh_step, x, w)  # under no_grad
    assert other["frames_loaded"] == 0 and other["entries_rejected"] == 1
    assert other["traced"] == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "grad_mode" in caplog.text  # the info line says why


def test_a_loaded_frame_counts_as_seen_for_automatic_dynamic(fresh_step):
    # A process that loads the static entry of length 4 and is then called at length 5 is
    # where a process that traced length 4 would be: Dynamo makes the frame dynamic at 5
    # (one symbolic graph, served by buckets). Before, a loaded entry left no trace in
    # Dynamo's automatic-dynamic state: each new process traced one more static frame (a
    # compile per process and length, a static entry more in the cache), as a decode loop's
    # next length in every warm generate() did.
    w = torch.randn(8, 8)
    _call(fresh_step, torch.randn(4, 8), w)           # first process: static, saved
    for process in range(2):                          # later processes: 4, then 5
        compiled, eager = fresh_step()
        traced = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        with torch.no_grad():
            for rows in (4, 5):
                x = torch.randn(rows, 8)
                torch.testing.assert_close(compiled(x, w), eager(x, w), rtol=1e-5, atol=1e-5)
        counts = torchtpu_compile.stats()["caches"]["dynamo"]["all"]
        assert counts["frames_loaded"] == 1, (process, counts)
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - traced == 1
        assert counts["bypasses"] == 1, (process, counts)  # the symbolic frame, not stored
        assert counts["bytes_written"] == 0, (process, counts)  # no static frame at 5


def test_a_warm_load_leaves_torchs_generator_as_manual_seed_set_it(tmp_path):
    # Building a graph's program drew its device-random keys once as an example value, from
    # torch's default generator. Dynamo restores the generator around a frame it traces, so a
    # cold process never showed it; a frame served by this cache was built outside that, and the
    # first call after torch.manual_seed gave other numbers than the cold process's.
    from tests.support.warm_workloads import cold_then_warm
    cold, warm = cold_then_warm("device_random_draws", tmp_path / "cache")
    assert warm["counters"]["caches"]["dynamo"]["hits"] == 1, warm["counters"]
    for name, got in warm["results"].items():
        assert torch.equal(got, cold["results"][name]), f"{name} differs warm and cold"
    for result in (cold["results"], warm["results"]):
        # as eager's: the same seed gives the same numbers, and dropout keeps 1 / (1 - p)
        for draw in ("dropout", "normal"):
            assert torch.equal(result[f"{draw}_first"], result[f"{draw}_again"]), draw
        kept = result["dropout_first"][result["dropout_first"] != 0]
        torch.testing.assert_close(kept, torch.full_like(kept, 1 / 0.7))
        assert 0.6 < kept.numel() / 1000 < 0.8


def _script_output(tmp_path, name: str, source: str, *args: str) -> str:
    """The last line ``source``, saved as a file (Dynamo's cache needs the source), prints in a
    process of its own over ``tmp_path``'s cache dir, with the caches at their defaults."""
    env = python_env(TORCHTPU_CACHE_DIR=str(tmp_path / "cache"))
    for variable in ("TORCHTPU_REMOTE_CACHE", "TORCHTPU_GRAPH_CACHE", "TORCHTPU_DYNAMO_CACHE"):
        env.pop(variable, None)
    script = tmp_path / name
    script.write_text(source)
    proc = subprocess.run([sys.executable, str(script), *args], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


OPTIONS_SCRIPT = textwrap.dedent("""\
    import sys, torch, torchtpu_compile
    def f(x):
        return torch.sin(x) * 2
    options = {"matmul_precision": "highest"} if sys.argv[1] == "options" else None
    try:
        out = torch.compile(f, backend="torchtpu", options=options)(torch.ones(3))
        print("ran", (out - f(torch.ones(3))).abs().max().item())
    except Exception as exc:
        print("raised", "takes no options" in str(exc))
""")


def test_a_compile_with_options_is_not_served_past_the_backend(tmp_path):
    # torch.compile's options are an error of the backend (ignored, they could change numbers);
    # a frame served by this cache never reached the backend, so a warm process ran
    # options={"matmul_precision": "highest"} at the default precision, silently.
    # a cold process without options, a warm one with
    outputs = [_script_output(tmp_path, "options_script.py", OPTIONS_SCRIPT, how)
               for how in ("plain", "options")]
    assert outputs[0].startswith("ran") and float(outputs[0].split()[1]) <= 1e-6, outputs
    assert outputs[1] == "raised True", outputs


OVERLAP_SCRIPT = textwrap.dedent("""\
    import json, sys, torch, torchtpu_compile
    def f(a, b):
        a.add_(1)
        return b * 3
    first, second = (int(v) for v in sys.argv[1:3])
    z, z_eager = torch.arange(10.0), torch.arange(10.0)
    out = torch.compile(f, backend="torchtpu")(z[first:first + 6], z[second:second + 6])
    want = f(z_eager[first:first + 6], z_eager[second:second + 6])
    counts = torchtpu_compile.stats()["caches"]["dynamo"]["all"]
    print(json.dumps({"same": torch.equal(out, want) and torch.equal(z, z_eager),
                      "loaded": counts["frames_loaded"]}))
""")


def test_overlapping_inputs_are_traced_in_every_process(tmp_path):
    # Two views of one tensor, one written: aot_autograd rebuilds both from one base at the
    # offsets it traced, and Dynamo guards neither offset. The entry saved for z[0:6], z[4:10]
    # served z[1:7], z[3:9] in a second process and wrote the wrong elements (off by 1, the
    # output by 3), where a fresh trace is right.
    runs = [json.loads(_script_output(tmp_path, "overlap.py", OVERLAP_SCRIPT, *offsets))
            for offsets in (("0", "4"), ("1", "3"), ("0", "4"))]
    assert all(run["same"] for run in runs), runs
    assert [run["loaded"] for run in runs] == [0, 0, 0]


HOOKS_SCRIPT = textwrap.dedent("""\
    import json, sys, torch, torch.nn as nn, torchtpu_compile
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 2))
    x, case = torch.ones(1, 3), sys.argv[1]
    if case == "forward hook": m.register_forward_hook(lambda mod, a, o: o * 10)
    if case == "pre hook": m.register_forward_pre_hook(lambda mod, a: (a[0] * 3,))
    if case == "submodule hook": m[1].register_forward_hook(lambda mod, a, o: o + 1)
    if case == "global hook":
        nn.modules.module.register_module_forward_hook(
            lambda mod, a, o: o * 2 if isinstance(mod, nn.Tanh) else o)
    out = torch.compile(m, backend="torchtpu")(x)
    counts = torchtpu_compile.stats()["caches"]["dynamo"]["all"]
    print(json.dumps({"same": torch.allclose(out, m(x)), "loaded": counts["frames_loaded"]}))
""")


def check_hooked_module_is_not_served_an_unhooked_entry(tmp_path, case):
    """Three processes: no hook, no hook again (a warm load), then ``case``'s hook (a miss)."""
    first, again, hooked = (json.loads(_script_output(tmp_path, "hooks.py", HOOKS_SCRIPT, how))
                            for how in ("none", "none", case))
    assert first["same"] and again["same"] and again["loaded"] == 1, (first, again)
    assert hooked == {"same": True, "loaded": 0}, hooked


def test_a_module_hooked_in_this_process_is_not_served_an_unhooked_entry(tmp_path):
    # Dynamo does not guard a module's empty hook dicts by default (and, when asked to, reads
    # their length live): a process that registered a hook loaded the entry of one that had
    # not, and the hook never ran (the output 10x off). Pre, submodule and global hooks:
    # tests/slow/test_dynamo_cache_full.py.
    check_hooked_module_is_not_served_an_unhooked_entry(tmp_path, "forward hook")


DESCRIPTOR_SCRIPT = textwrap.dedent("""\
    import json, sys, torch, torchtpu_compile
    class Act(torch.nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn
        def forward(self, a):
            return self.fn(a) + 1
    def closure_over(op):
        return lambda a: op(a) * 2
    op = getattr(torch.Tensor, sys.argv[2])
    f = closure_over(op) if sys.argv[1] == "closure" else Act(op)
    x = torch.randn(5)
    out = torch.compile(f, backend="torchtpu")(x)
    counts = torchtpu_compile.stats()["caches"]["dynamo"]["all"]
    print(json.dumps({"same": torch.allclose(out, f(x)), "loaded": counts["frames_loaded"]}))
""")


def check_frame_holding_another_tensor_method_misses(tmp_path, holder):
    # Dynamo does not guard C method descriptors (torch.Tensor.sigmoid): a second process
    # calling the frame with sigmoid loaded the graph the first traced with relu
    runs = [json.loads(_script_output(tmp_path, "descriptors.py", DESCRIPTOR_SCRIPT, holder, op))
            for op in ("relu", "sigmoid", "relu")]
    assert all(run["same"] for run in runs), runs
    assert [run["loaded"] for run in runs] == [0, 0, 1]


def test_a_frame_holding_another_tensor_method_misses(tmp_path):
    # held by a closure; held by a module in tests/slow/test_dynamo_cache_full.py
    check_frame_holding_another_tensor_method_misses(tmp_path, "closure")


def _compile_ids_taken(backend: str, fn, calls) -> int:
    """How many compile ids Dynamo's frame counters gave out while ``fn`` compiled with
    ``backend`` (static shapes) ran on each of ``calls``."""
    from torch._dynamo.convert_frame import FRAME_COMPILE_COUNTER
    torch._dynamo.reset()
    before = sum(FRAME_COMPILE_COUNTER.values())
    compiled = torch.compile(fn, backend=backend, dynamic=False)
    for args in calls:
        compiled(*args)
    return sum(FRAME_COMPILE_COUNTER.values()) - before


def test_a_recompile_gets_the_compile_id_dynamo_alone_would(fresh_dynamo):
    # a lookup that found nothing took an id too, so the frame's second trace was logged
    # as [0/3], not [0/1] (Whisper's generate() reached "[0/17] hit recompile_limit (8)")
    def scaled(x):
        return torch.relu(x) * 2.0 + 1.0

    calls = [(torch.randn(4, 8),), (torch.randn(3, 8),), (torch.randn(2, 8),)]
    assert _compile_ids_taken("torchtpu", scaled, calls) == _compile_ids_taken("eager", scaled,
                                                                                calls) == 3


def test_a_length_guard_on_a_value_without_a_length_now_is_a_plain_miss(fresh_dynamo, caplog):
    # An entry traced with a tuple kernel size, looked up where it is an int: the fingerprint
    # took len() of the int, and each lookup warned that the entry was unusable (TypeError).
    def pool_by(k):
        return lambda x: torch.nn.functional.max_pool2d(x, k)
    x = torch.randn(1, 2, 6, 6)
    with caplog.at_level(logging.WARNING, logger="torchtpu"):
        for k in ((2, 2), 2):
            torch._dynamo.reset()
            compiled = torch.compile(pool_by(k), backend="torchtpu", dynamic=False)
            torch.testing.assert_close(compiled(x), pool_by(k)(x))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_loaded_entrys_globals_outlive_dropped_code_not_yet_collected():
    # A transformers model compiled again after torch._dynamo.reset(): the first trace's code,
    # dropped but not collected (a reference cycle), had installed the builtins dict the
    # entry's guards read. The entry found it and did not install it again; the collection
    # that came while loading deleted it (Dynamo's cleanup of that code): KeyError
    # '__builtins_dict___0', an ERROR traceback from Dynamo, and a trace again.
    import gc
    import types

    from torch._dynamo.output_graph import get_builtins_dict
    from torch._dynamo.utils import CleanupHook, CleanupManager
    scope = {"__builtins__": __builtins__}
    name = "__builtins_dict___7"
    dropped = compile("pass", "<dropped>", "exec")
    CleanupManager.instance[dropped] = [CleanupHook.create(scope, name,
                                                           get_builtins_dict(scope))]
    cycle = [dropped]
    cycle.append(cycle)
    del dropped, cycle
    entry = types.SimpleNamespace(installed_globals={name: ("builtins_dict",)})
    gc.disable()
    try:
        dynamo_cache._install_globals(entry, scope)
    finally:
        gc.enable()
    gc.collect()  # any collection after the load
    assert scope.get(name) is get_builtins_dict(scope)
