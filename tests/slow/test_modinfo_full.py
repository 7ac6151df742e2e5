"""The whole ModuleInfo sweep: every ``module_db`` entry (PyTorch's own nn.Module test inputs) on
each path (compile, eager, fuse), in fp32, against eager CPU: forward outputs, gradients of
parameters and inputs, and the module's state after the call (tests/support/opinfo/modules.py).

The sweep runs once per session in crash-isolated worker processes (the OpInfo sweep's,
``--db modules``) and writes build/coverage/modinfo.json. Each (entry, path) is one test: pass,
a named skip (skips.MODULE_SKIPS), an xfail for a fallback (the ops named) or for a known
failure (modules.KNOWN_FAILURES, each with its reason), or a failure. Environment:
TORCHTPU_OPINFO_JOBS (parallel workers, default 2), TORCHTPU_OPINFO_PATHS (comma list).
"""
from __future__ import annotations

import os
import time

import pytest

from tests.support.opinfo import sweep as sweeper
from tests.support.opinfo.modules import KNOWN_FAILURES, MAX_SAMPLES
from tests.support.opinfo.verdict import assert_result

pytestmark = pytest.mark.slow

RESULTS = os.path.join("build", "coverage", "modinfo.json")
PATHS = os.environ.get("TORCHTPU_OPINFO_PATHS", ",".join(sweeper.PATHS)).split(",")
ENTRIES = sweeper.entries(db="modules")


@pytest.fixture(scope="module")
def results():
    start = time.perf_counter()
    jobs = int(os.environ.get("TORCHTPU_OPINFO_JOBS", "2"))
    found = sweeper.sweep(ENTRIES, PATHS, ("fp32",), max_samples=MAX_SAMPLES, jobs=jobs,
                          log=lambda r: None, db="modules")
    sweeper.write(RESULTS, found, time.perf_counter() - start, MAX_SAMPLES)
    return {(r["op"], r["path"]): r for r in found}


class _Result:
    def __init__(self, record: dict):
        self.__dict__.update(record)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("entry", ENTRIES)
def test_module(results, entry, path):
    result = _Result(results[(entry, path)])
    known = KNOWN_FAILURES.get((entry, path))
    if known is not None:
        assert result.status == "fail", \
            f"{entry} on {path} is {result.status} now: remove it from KNOWN_FAILURES"
        pytest.xfail(f"[known failure] {entry} on {path}: {known} ({result.detail})")
    assert_result(result)
