"""The diagnostics in bench/ that no benchmark run calls, run as a user would start them, so
that they keep up with the code they take apart (bench/profile_overhead.py's eager-op stages
called the eager device's internals by an older shape, and failed, unnoticed)."""
import os
import subprocess
import sys

import pytest

from tests.support import ROOT, python_env

pytestmark = pytest.mark.slow


def test_profile_overhead_breaks_an_eager_op_into_stages():
    done = subprocess.run([sys.executable, "-c",
                           "import profile_overhead; profile_overhead.eager_op_stages()"],
                          cwd=os.path.join(ROOT, "bench"), env=python_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for stage in ("CPU eager x + 1", "tpu strict x + 1 (whole op)", "signature() lookup",
                  "input values", "execute + memory bookkeeping", "new wrapper tensor"):
        assert stage in done.stdout, (stage, done.stdout)
    assert "Python and C calls per op" in done.stdout
