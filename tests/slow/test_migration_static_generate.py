"""generate() with a static cache on a tpu model, as a CUDA user writes it: transformers
compiles the decoding step itself, with ``backend="tpu"`` (tests/migration/llama_generate.py);
the tokens must be eager CPU's. Fresh processes, as the other migration scripts run."""
import json
import subprocess
import sys

import pytest

from tests.support import python_env

pytestmark = pytest.mark.slow


def _run(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.migration.llama_generate", *args],
                          capture_output=True, text=True, timeout=900, env=python_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_static_cache_generate_compiles_itself_on_tpu():
    want = _run("cpu", "static")
    got = _run("tpu", "static")
    assert (want["device"], got["device"]) == ("cpu", "tpu:0")
    assert want["frames_compiled"] == 0 and got["frames_compiled"] > 0  # transformers compiled
    assert got["tokens"] == want["tokens"] and len(got["tokens"][0]) == 8
    assert got["graph_breaks"] == {}
