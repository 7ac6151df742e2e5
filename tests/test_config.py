"""torchtpu_compile.config: every setting's variable is honoured, bad values are errors naming
the variable, patch scopes and restores, compile_hash follows the compile-relevant settings,
the deprecated TORCH_TPU_FUSE_* names still work, and docs/configuration.md is in sync."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import threading
import warnings

import pytest

from torchtpu_compile import config
from torchtpu_compile.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: A value other than the default for every setting's variable, and what the setting reads.
FROM_ENVIRONMENT = {
    "platform": ("CPU", "cpu"),
    "cpu_dispatch": ("ASYNC", "async"),
    "matmul_precision": ("high", "high"),
    "strict": ("yes", True),
    "check_indices": ("off", False),
    "donate_buffers": ("no", False),
    "random_draws": ("device", "device"),
    "split_backward": ("ON", "on"),
    "excess_precision": ("ON", "on"),
    "exact_index_arithmetic": ("off", False),
    "cache_dir": ("/tmp/somewhere", "/tmp/somewhere"),
    "cache_max_bytes": ("1048576", 1 << 20),
    "remote_cache": ("file:///tmp/remote", "file:///tmp/remote"),
    "cache_key": ("team secret", "team secret"),
    "graph_cache": ("0", False),
    "process_cache_entries": ("64", 64),
    "process_cache_programs": ("8", 8),
    "dynamo_cache": ("1", True),
    "buckets": ("false", False),
    "bucket_policy": ("16,64,256", "16,64,256"),
    "bucket_min": ("4", 4),
    "max_buckets": ("3", 3),
    "background_buckets": ("on", True),
    "launch_blocking": ("1", True),
    "backward_on_calling_thread": ("0", False),
    "defer_and_fuse": ("on", True),
    "fuse_max_ops": ("7", 7),
    "fuse_max_inputs": ("9", 9),
    "fuse_repeats": ("0", False),
    "fuse_compile_at": ("3", 3),
    "dist_coordinator_host": ("10.0.0.1", "10.0.0.1"),
    "dist_transport": ("staged", "staged"),
    "dist_check": ("0", False),
}

#: (variable, value, a fragment of the accepted values the error must list)
INVALID = [
    ("TORCHTPU_MAX_BUCKETS", "abc", "an integer >= 1"),
    ("TORCHTPU_MATMUL_PRECISION", "fast", "medium, high, highest"),
    ("TORCHTPU_BUCKET_POLICY", "weird", "pow2-128, pow2, multiple-N"),
    ("TORCHTPU_BUCKET_POLICY", "multiple-0", "multiple-N (N >= 1)"),
    ("TORCHTPU_STRICT", "maybe", "1, true, yes, on or 0, false, no, off"),
    ("TORCHTPU_CACHE_MAX_BYTES", "4G", "an integer >= 0"),
    ("TORCHTPU_FUSE_MAX_OPS", "0", "an integer >= 1"),
    ("TORCHTPU_DIST_TRANSPORT", "fast", "auto, staged"),
    ("TORCHTPU_PLATFORM", "gpu0", "tpu, cuda, cpu"),
]


def setting_of(variable: str):
    return next(s for s in config.settings() if s.env == variable)


# --- declarations ----------------------------------------------------------------------------

def test_every_setting_is_declared_once_with_a_torchtpu_variable():
    names = [s.name for s in config.settings()]
    variables = [s.env for s in config.settings()]
    assert len(set(names)) == len(names) and len(set(variables)) == len(variables)
    seed_names = {"TORCH_TPU_LAUNCH_BLOCKING", "TORCH_TPU_DEFER_AND_FUSE"}
    assert seed_names <= set(variables)
    assert all(v.startswith("TORCHTPU_") for v in set(variables) - seed_names), variables
    assert set(FROM_ENVIRONMENT) == set(names), "add the new setting to FROM_ENVIRONMENT"


def test_the_package_reads_the_environment_only_through_config():
    """Every ``os.environ`` read of the two packages is in config.py, but for variables other
    systems own (TORCH_LOGS, TORCH_TRACE, MASTER_ADDR, JAX_PARTITION_INDEX, XLA's log level
    and flags)."""
    foreign = ("TORCH_LOGS", "TORCH_TRACE", "MASTER_ADDR", "JAX_PARTITION_INDEX",
               "TF_CPP_MIN_LOG_LEVEL", "XLA_FLAGS", "LIBTPU_INIT_ARGS")
    found = []
    for package in ("torchtpu_compile", "torchtpu_eager"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                path = os.path.join(folder, name)
                if not name.endswith(".py") or path.endswith(os.path.join("torchtpu_compile",
                                                                          "config.py")):
                    continue
                for number, line in enumerate(open(path), 1):
                    if re.search(r"os\.environ|getenv", line) and \
                            not any(v in line for v in foreign):
                        found.append(f"{path}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


# --- the environment -------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(FROM_ENVIRONMENT))
def test_each_variable_is_honoured_when_the_setting_is_read(name, monkeypatch):
    setting = next(s for s in config.settings() if s.name == name)
    raw, expected = FROM_ENVIRONMENT[name]
    monkeypatch.setenv(setting.env, raw)
    assert getattr(config, name) == expected
    monkeypatch.setenv(setting.env, "")  # empty is unset: the default
    default = setting.default_factory() if setting.default_factory else setting.default
    assert getattr(config, name) == default


def test_code_wins_over_the_variable_until_reset(monkeypatch):
    monkeypatch.setenv("TORCHTPU_MAX_BUCKETS", "3")
    config.max_buckets = 5
    try:
        assert config.max_buckets == 5
    finally:
        config.reset("max_buckets")
    assert config.max_buckets == 3


def test_variables_reach_their_consumers(monkeypatch):
    from torchtpu_compile.buckets.policy import bucket_size, choose
    from torchtpu_eager import modes
    from torchtpu_eager.distributed import pjrt_world
    from torchtpu_eager.fuse import DeferAndFuse
    monkeypatch.setenv("TORCHTPU_FUSE_MAX_OPS", "7")
    monkeypatch.setenv("TORCHTPU_FUSE_MAX_INPUTS", "9")
    monkeypatch.setenv("TORCHTPU_FUSE_REPEATS", "0")
    fused = DeferAndFuse()  # read when the mode is entered
    assert (fused.max_ops, fused.max_inputs, fused.cut_repeats) == (7, 9, False)
    monkeypatch.setenv("TORCH_TPU_LAUNCH_BLOCKING", "1")
    assert modes._from_environment().name == "debug"
    monkeypatch.setenv("TORCH_TPU_DEFER_AND_FUSE", "1")
    with pytest.raises(RuntimeError, match="cannot be combined"):
        modes._from_environment()
    monkeypatch.setenv("TORCHTPU_DIST_COORDINATOR_HOST", "10.1.2.3")
    assert pjrt_world._coordinator_host(None) == "10.1.2.3"
    monkeypatch.setenv("TORCHTPU_DIST_TRANSPORT", "staged")
    assert pjrt_world.placement(None, 0, 1, None) == \
        (None, "TORCHTPU_DIST_TRANSPORT=staged when the group was made")
    monkeypatch.setenv("TORCHTPU_BUCKET_POLICY", "multiple-64")
    assert bucket_size(100) == 128
    monkeypatch.setenv("TORCHTPU_MAX_BUCKETS", "abc")
    with pytest.raises(ConfigError, match="TORCHTPU_MAX_BUCKETS='abc'"):
        choose((100,), [(64,)])


def test_variables_set_before_the_process_starts():
    code = ("import torch, torchtpu_eager\n"
            "from torchtpu_compile import config\n"
            "from torchtpu_eager import modes\n"
            "x = torch.ones(3, device='tpu') * 2\n"
            "assert x.sum().item() == 6.0\n"
            "print(torch.tpu.get_eager_mode(), modes.current().max_ops, config.max_buckets,\n"
            "      config.cache_dir)\n")
    env = dict(os.environ, TORCH_TPU_DEFER_AND_FUSE="1", TORCHTPU_FUSE_MAX_OPS="77",
               TORCHTPU_MAX_BUCKETS="3", TORCHTPU_CACHE_DIR="off")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["defer_and_fuse", "77", "3", "None"]


def test_an_invalid_variable_fails_the_compile_naming_it():
    code = ("import torch\n"
            "torch.compile(lambda x: x @ x, backend='torchtpu')(torch.ones(2, 2))\n")
    env = dict(os.environ, TORCHTPU_MATMUL_PRECISION="fast")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode != 0
    assert "ConfigError: TORCHTPU_MATMUL_PRECISION='fast' is not accepted" in done.stderr
    assert "one of medium, high, highest" in done.stderr


# --- invalid values --------------------------------------------------------------------------

@pytest.mark.parametrize("variable,raw,accepted", INVALID)
def test_an_invalid_variable_is_an_error_naming_it(variable, raw, accepted, monkeypatch):
    monkeypatch.setenv(variable, raw)
    name = setting_of(variable).name
    with pytest.raises(ConfigError) as info:
        getattr(config, name)
    message = str(info.value)
    assert f"{variable}={raw!r}" in message and f"config.{name}" in message
    assert accepted in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name,value,accepted", [
    ("max_buckets", "abc", "an integer >= 1"), ("max_buckets", 0, "an integer >= 1"),
    ("max_buckets", 2.5, "an integer >= 1"), ("strict", 1, "True or False"),
    ("matmul_precision", "fast", "medium, high, highest"),
    ("bucket_policy", "weird", "pow2-128"), ("bucket_policy", [64], "a list of sizes"),
    ("cache_dir", "", "a folder"), ("dist_transport", None, "auto, staged"),
])
def test_an_invalid_assignment_is_an_error_and_changes_nothing(name, value, accepted):
    before = getattr(config, name)
    with pytest.raises(ConfigError) as info:
        setattr(config, name, value)
    message = str(info.value)
    assert f"config.{name} = {value!r}" in message and accepted in message
    assert setting_of_name(name).env in message
    assert getattr(config, name) == before


def setting_of_name(name: str):
    return next(s for s in config.settings() if s.name == name)


def test_valid_assignments_are_normalized():
    with config.patch(platform=" CPU ", matmul_precision="HIGHEST", bucket_policy=[16, 64],
                      cache_dir=pathlib.Path(ROOT)):
        assert (config.platform, config.matmul_precision) == ("cpu", "highest")
        assert config.bucket_policy == [16, 64] and config.cache_dir == ROOT
    policy = lambda size: size + 1  # noqa: E731
    with config.patch(bucket_policy=policy):
        assert config.bucket_policy is policy


def test_a_secret_is_never_shown():
    with pytest.raises(ConfigError) as info:
        config.cache_key = 12345
    assert "12345" not in str(info.value) and "<secret>" in str(info.value)


def test_an_unknown_setting_is_an_error_with_a_suggestion():
    with pytest.raises(AttributeError, match="did you mean matmul_precision"):
        config.matmul_presicion = "highest"
    with pytest.raises(AttributeError, match="no setting 'nope'"):
        config.patch(nope=1)
    assert not hasattr(config, "matmul_presicion")


# --- patch -----------------------------------------------------------------------------------

def test_patch_scopes_nests_and_restores(monkeypatch):
    monkeypatch.setenv("TORCHTPU_MAX_BUCKETS", "3")
    config.bucket_min = 2
    try:
        with config.patch(max_buckets=5, bucket_min=4):
            assert (config.max_buckets, config.bucket_min) == (5, 4)
            with config.patch(max_buckets=6):
                assert config.max_buckets == 6
            assert config.max_buckets == 5
        assert (config.max_buckets, config.bucket_min) == (3, 2)  # the variable, the code value
        monkeypatch.setenv("TORCHTPU_MAX_BUCKETS", "4")
        assert config.max_buckets == 4  # still following the variable after the patch
    finally:
        config.reset("bucket_min")


def test_patch_restores_on_an_exception():
    before = config.strict
    with pytest.raises(KeyError):
        with config.patch(strict=not before):
            assert config.strict is (not before)
            raise KeyError("boom")
    assert config.strict is before


def test_patch_checks_every_value_before_changing_any():
    before = (config.strict, config.max_buckets)
    with pytest.raises(ConfigError, match="max_buckets"):
        config.patch(strict=True, max_buckets=-1)
    assert (config.strict, config.max_buckets) == before


def test_patch_as_a_decorator_also_when_reentered():
    before = config.max_buckets

    @config.patch(max_buckets=2)
    def depth(n):
        assert config.max_buckets == 2
        return depth(n - 1) + 1 if n else 0

    assert depth(3) == 3
    assert config.max_buckets == before


def test_a_setting_applies_to_every_thread():
    seen = []
    with config.patch(matmul_precision="high"):
        worker = threading.Thread(target=lambda: seen.append(config.matmul_precision))
        worker.start()
        worker.join()
    assert seen == ["high"]


# --- compile_hash ----------------------------------------------------------------------------

def test_compile_hash_follows_only_compile_relevant_settings():
    base = config.compile_hash()
    assert config.compile_hash() == base
    other_precision = "high" if config.matmul_precision != "high" else "medium"
    for changes in ({"check_indices": not config.check_indices},
                    {"matmul_precision": other_precision}):
        with config.patch(**changes):
            assert config.compile_hash() != base, changes
    for changes in ({"strict": not config.strict}, {"max_buckets": config.max_buckets + 1},
                    {"bucket_policy": "pow2"}, {"cache_dir": "/tmp/elsewhere"},
                    {"fuse_max_ops": 3}, {"dist_check": False}):
        with config.patch(**changes):
            assert config.compile_hash() == base, changes
    assert config.compile_hash() == base


def test_the_lowering_cache_key_follows_compile_hash():
    import torch.fx as fx

    from torchtpu_compile.lower.cache import graph_key
    gm = fx.symbolic_trace(lambda x: x + 1)
    base = graph_key(gm, "cpu", "highest")
    with config.patch(check_indices=not config.check_indices):
        assert graph_key(gm, "cpu", "highest") != base
    with config.patch(strict=not config.strict):
        assert graph_key(gm, "cpu", "highest") == base


# --- deprecated names ------------------------------------------------------------------------

@pytest.mark.parametrize("old,new,raw,expected", [
    ("TORCH_TPU_FUSE_MAX_OPS", "fuse_max_ops", "11", 11),
    ("TORCH_TPU_FUSE_MAX_INPUTS", "fuse_max_inputs", "13", 13),
    ("TORCH_TPU_FUSE_REPEATS", "fuse_repeats", "0", False),
])
def test_old_fuse_variables_still_work_with_a_warning(old, new, raw, expected, monkeypatch):
    monkeypatch.setattr(sys.modules[config.__name__], "_warned", set())
    monkeypatch.setenv(old, raw)
    with pytest.warns(FutureWarning, match=f"{old} is deprecated.*TORCHTPU_"):
        assert getattr(config, new) == expected
    from torchtpu_eager.fuse import DeferAndFuse
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process
        fused = DeferAndFuse()
    assert {"fuse_max_ops": fused.max_ops, "fuse_max_inputs": fused.max_inputs,
            "fuse_repeats": fused.cut_repeats}[new] == expected
    monkeypatch.setenv(setting_of_name(new).env, "1" if new == "fuse_repeats" else "5")
    assert getattr(config, new) == (True if new == "fuse_repeats" else 5)  # the new name wins


def test_an_invalid_old_variable_is_named_in_the_error(monkeypatch):
    monkeypatch.setattr(sys.modules[config.__name__], "_warned", {"TORCH_TPU_FUSE_MAX_OPS"})
    monkeypatch.setenv("TORCH_TPU_FUSE_MAX_OPS", "lots")
    with pytest.raises(ConfigError, match="TORCH_TPU_FUSE_MAX_OPS='lots'"):
        _ = config.fuse_max_ops


# --- the reference ---------------------------------------------------------------------------

def test_the_configuration_doc_is_generated_from_the_declarations():
    with open(os.path.join(ROOT, "docs", "configuration.md")) as f:
        assert f.read() == config.reference(), "run `make config-docs`"
    table = config.describe()
    for setting in config.settings():
        assert f"| `{setting.name}` | `{setting.env}`" in table


def test_reading_a_setting_is_cheap():
    """Settings are read per eager op and per compiled call: a read that follows the
    environment stays well under a microsecond or two."""
    import time
    start = time.perf_counter()
    for _ in range(10000):
        _ = config.matmul_precision
    per_read = (time.perf_counter() - start) / 10000
    assert per_read < 5e-6, per_read


def test_torch_compile_options_are_an_error_and_mode_a_warning(caplog):
    # Dynamo hands a backend torch.compile's options and mode; both were silently ignored, so
    # options={"matmul_precision": "highest"} compiled at the default precision.
    import torch

    from tests.support.helpers import compile_tpu
    with pytest.raises(Exception, match="the torchtpu backend takes no options.*"
                                        "config.matmul_precision = 'highest'"):
        compile_tpu(torch.sin, options={"matmul_precision": "highest"})(torch.ones(3))
    with caplog.at_level("WARNING", logger="torchtpu"):
        out = compile_tpu(torch.sin, mode="reduce-overhead")(torch.ones(3))
    assert torch.equal(out, torch.sin(torch.ones(3)))
    assert any("ignoring torch.compile arguments {'mode': 'reduce-overhead'}" in r.getMessage()
               for r in caplog.records)


def test_a_variable_that_nearly_spells_a_setting_is_warned_about():
    # TORCHTPU_DEFER_AND_FUSE (the mode's variable is TORCH_TPU_DEFER_AND_FUSE) and a missing
    # letter were ignored without a word: the run went on in strict mode, at the default
    # precision.
    with pytest.warns(UserWarning, match="did you mean TORCH_TPU_DEFER_AND_FUSE"):
        config._check_variable_names({"TORCHTPU_DEFER_AND_FUSE": "1"})
    with pytest.warns(UserWarning, match="did you mean TORCHTPU_MATMUL_PRECISION"):
        config._check_variable_names({"TORCHTPU_MATMUL_PRECISON": "highest"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # names of our own, other tools', and the real ones
        config._check_variable_names({"TORCHTPU_MATMUL_PRECISION": "highest",
                                      "TORCHTPU_OPINFO_JOBS": "2", "PATH": "/bin"})
