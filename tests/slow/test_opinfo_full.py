"""The whole OpInfo sweep: every op_db entry on each path (compile, eager, fuse), in fp32, bf16 and
complex64 (against a complex128 reference where complex64 rounds more), against eager CPU.

The sweep runs once per session in crash-isolated worker processes (tests/support/opinfo/sweep.py)
and writes build/coverage/opinfo.json, from which ``make coverage`` renders docs/coverage.md. Each
(entry, path, dtype) is then one test: pass, a named skip (skips.py), an xfail for a fallback
(the ops named), or a failure. Environment: TORCHTPU_OPINFO_JOBS (parallel workers, default 2),
TORCHTPU_OPINFO_PATHS / TORCHTPU_OPINFO_DTYPES (comma lists, default all).
"""
from __future__ import annotations

import collections
import os
import time

import pytest

from tests.support.opinfo import sweep as sweeper
from tests.support.opinfo.verdict import assert_result

pytestmark = pytest.mark.slow

RESULTS = os.path.join("build", "coverage", "opinfo.json")
PATHS = os.environ.get("TORCHTPU_OPINFO_PATHS", ",".join(sweeper.PATHS)).split(",")
DTYPES = os.environ.get("TORCHTPU_OPINFO_DTYPES", ",".join(sweeper.DTYPES)).split(",")
ENTRIES = sweeper.entries()

#: The issue's bars, in fp32: the compile path and the eager tpu device.
MIN_COMPILE_FP32_PASSES = 450
MIN_EAGER_FP32_PASSES = 400
MIN_FUSE_FP32_PASSES = 400


@pytest.fixture(scope="module")
def results():
    start = time.perf_counter()
    jobs = int(os.environ.get("TORCHTPU_OPINFO_JOBS", "2"))
    found = sweeper.sweep(ENTRIES, PATHS, DTYPES, jobs=jobs, log=lambda r: None)
    sweeper.write(RESULTS, found, time.perf_counter() - start, 3)
    return {(r["op"], r["path"], r["dtype"]): r for r in found}


class _Result:
    def __init__(self, record: dict):
        self.__dict__.update(record)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("entry", ENTRIES)
def test_entry(results, entry, path, dtype):
    assert_result(_Result(results[(entry, path, dtype)]))


@pytest.mark.parametrize("path, bar", [("compile", MIN_COMPILE_FP32_PASSES),
                                       ("eager", MIN_EAGER_FP32_PASSES),
                                       ("fuse", MIN_FUSE_FP32_PASSES)])
def test_fp32_pass_count(results, path, bar):
    if path not in PATHS or "fp32" not in DTYPES:
        pytest.skip(f"the {path} fp32 sweep is not selected")
    status = collections.Counter(r["status"] for (_, p, d), r in results.items()
                                 if p == path and d == "fp32")
    assert status["pass"] >= bar, dict(status)
