"""The command-line tools as a CI job runs them, each in fresh processes (moved out of the
fast suite: each starts several Pythons): the numerics CLI's exit codes and its pytest plugin
(tests/test_numerics.py has the in-process API), and the AOT CLI's export, inspect and run
(tests/test_aot.py has the in-process API)."""
import json
import subprocess
import sys
import textwrap

import pytest

from tests.support import aot_factories, python_env
from tests.test_numerics import run_in

pytestmark = pytest.mark.slow


def test_cli_exit_codes(tmp_path):
    cli = ["-m", "torchtpu_compile.numerics"]
    ok = run_in(tmp_path, *cli, "factories:good", "--reference", "cpu", "--precision",
                "highest", "--train", "--json", "good.json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "PASSED" in ok.stdout
    data = json.loads((tmp_path / "good.json").read_text())
    assert data["passed"] and data["train"] and len(data["checks"]) == 5

    bad = run_in(tmp_path, *cli, "factories:bad", "--reference", "cpu", "--precision",
                 "highest", "--locate", "--json", "bad.json")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "first divergence: aten.tanh.default" in bad.stdout
    assert "in module 1 (Tanh)" in bad.stdout  # nn.Tanh has no user source line
    data = json.loads((tmp_path / "bad.json").read_text())
    assert not data["passed"] and data["divergence"]["op"] == "aten.tanh.default"

    usage = run_in(tmp_path, *cli, "factories:missing")
    assert usage.returncode == 2 and "no callable 'missing'" in usage.stderr


def test_pytest_plugin(tmp_path):
    (tmp_path / "test_user.py").write_text(textwrap.dedent("""
        from factories import good

        def test_good(assert_numerics):
            report = assert_numerics(*good())
            assert report.precision == "highest" and report.reference == "cpu"
    """))
    result = run_in(tmp_path, "-m", "pytest", "-q", "-p", "torchtpu_compile.numerics.pytest_plugin",
                    "--torchtpu-reference", "cpu", "--torchtpu-precision", "highest",
                    "-p", "no:cacheprovider", "test_user.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def test_cli_export_inspect_run(tmp_path):
    path = str(tmp_path / "mlp.tpu")
    cli = [sys.executable, "-m", "torchtpu_compile.aot"]
    env = python_env()
    done = subprocess.run(cli + ["export", "tests.support.aot_factories:mlp", "--out", path,
                                 "--precision", "highest"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    shown = subprocess.run(cli + ["inspect", path], env=env, capture_output=True, text=True,
                           timeout=300)
    assert shown.returncode == 0
    for text in ("float32[5, 8]", "torch-mlir 20261001", "stablehlo.dot_general: 2",
                 "params.safetensors", "precision highest"):
        assert text in shown.stdout
    ran = subprocess.run(cli + ["run", path], env=env, capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    model, (x,) = aot_factories.mlp()
    assert f"sum={model(x).sum().item():.6g}"[:9] in ran.stdout
    (tmp_path / "bad.tpu").write_bytes(b"not an artifact")
    bad = subprocess.run(cli + ["inspect", str(tmp_path / "bad.tpu")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "not a readable torchtpu artifact" in bad.stderr
