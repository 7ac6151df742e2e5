"""The Dynamo-level cache, the rest of its safety checks (each a fresh process over a filled
cache): a changed module global, a changed input dtype, a damaged entry, another tensor method
held by a module; and the cache's bookkeeping: turned on in code after the backend's import, an
entry refused for a name already taken."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

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


@pytest.mark.parametrize("case", ["pre hook", "submodule hook", "global hook"])
def test_a_module_hooked_in_this_process_is_not_served_an_unhooked_entry(tmp_path, case):
    fast.check_hooked_module_is_not_served_an_unhooked_entry(tmp_path, case)


def test_a_frame_holding_another_tensor_method_in_a_module_misses(tmp_path):
    fast.check_frame_holding_another_tensor_method_misses(tmp_path, "module")


def test_turned_on_in_code_after_the_backend_was_imported(tmp_path):
    # The cache hooked into Dynamo only if it was on when the backend was first imported:
    # a process that started with it off (TORCHTPU_DYNAMO_CACHE=0, or a test fixture) and
    # turned it on in code later saved nothing, silently.
    (tmp_path / "turned_on_step.py").write_text("def step(x):\n    return x * 2 + 1\n")
    code = textwrap.dedent(f"""\
        import json, sys, torch, torchtpu_compile
        import torchtpu_compile.backend
        torchtpu_compile.config.dynamo_cache = True
        sys.path.insert(0, {str(tmp_path)!r})
        from turned_on_step import step
        torch.compile(step, backend="torchtpu")(torch.ones(3))
        print(json.dumps(torchtpu_compile.stats()["caches"]["dynamo"]["all"]))
    """)
    env = dict(os.environ, TORCHTPU_CACHE_DIR=str(tmp_path / "cache"),
               TORCHTPU_DYNAMO_CACHE="0", PYTHONDONTWRITEBYTECODE="1")
    env.pop("TORCHTPU_REMOTE_CACHE", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["bytes_written"] > 0, counts


RESET_SCRIPT = textwrap.dedent("""\
    import json, torch, torchtpu_compile
    f = lambda x: (x.sin() * 3).sum(-1)
    x = torch.randn(4, 4)
    torch.compile(f, backend="torchtpu")(x)
    torch._dynamo.reset()
    torchtpu_compile.reset_stats()
    out = torch.compile(f, backend="torchtpu")(x)
    print(json.dumps({"hits": torchtpu_compile.stats()["cache_hits"],
                      "diff": (out - f(x)).abs().max().item()}))
""")


def test_an_entry_refused_for_a_taken_name_loads_no_graph(tmp_path):
    # A warm process loads a frame's entry, which installs the graph's global; after
    # torch._dynamo.reset() the entry is refused because that name is taken. The refusal came
    # after the graph was loaded (aot_autograd entry, lowering, executable), which then went
    # unused: two executable lookups for one graph.
    for process in ("cold", "warm"):
        result = json.loads(fast._script_output(tmp_path, "reset_script.py", RESET_SCRIPT))
        assert result["hits"] == 1 and result["diff"] <= 1e-5, (process, result)
