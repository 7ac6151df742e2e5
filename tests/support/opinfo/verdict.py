"""How a harness ``Result`` becomes a pytest outcome.

pass -> the test passes; skip -> ``pytest.skip`` naming the category and reason (ours-to-fix
skips stay visible in ``-ra``); fallback -> ``pytest.xfail`` naming the ops and why they ran
outside XLA; fail -> the test fails with the harness's message.
"""
from __future__ import annotations

import pytest


def assert_result(result) -> None:
    """Turn ``result`` into a pytest outcome (see module doc).

    Example::

        assert_result(check(op, "compile", torch.float32))
    """
    where = f"{result.op} on {result.path} {result.dtype}"
    if result.status == "skip":
        pytest.skip(f"[{result.category}] {where}: {result.detail}")
    if result.status == "n/a":
        pytest.skip(f"[n/a] {where}: {result.detail}")
    if result.status == "fallback":
        pytest.xfail(f"[falls back, {result.category}] {where}: {result.detail}")
    assert result.status == "pass", f"{where}: {result.detail}"
