"""How a harness ``Result`` becomes a pytest outcome.

``assert_result`` (the whole sweep, where gaps are expected and counted): pass -> the test
passes; skip -> ``pytest.skip`` naming the category and reason (ours-to-fix skips stay visible
in ``-ra``); fallback -> ``pytest.xfail`` naming the ops and why they ran outside XLA; fail ->
the test fails with the harness's message.

``assert_passes`` (make test's FAST entries, which pass today): anything but a pass fails, a
fallback and a skip included, so that an entry that starts falling back is a regression.
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


def assert_passes(result) -> None:
    """Fail the test unless ``result`` is a pass: matched eager on every sample, with nothing
    run outside XLA (a fallback, a graph break, a skip or an unavailable path all fail).

    Example::

        assert_passes(check(op, "eager", torch.float32))
    """
    where = f"{result.op} on {result.path} {result.dtype}"
    category = f", {result.category}" if result.category else ""
    assert result.status == "pass", f"{where}: {result.status}{category}: {result.detail}"
