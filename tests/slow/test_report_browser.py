"""The compile report, end to end: a TORCH_TRACE run in a fresh process, ``python -m
torchtpu_compile.report`` on its folder, and the page opened in a real headless browser
(Debian's ``chromium``; ``make test-full`` installs it if missing), which must draw every
section and every plot with no server and no network.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from torchtpu_compile import report

pytestmark = pytest.mark.slow

_RUN = textwrap.dedent("""
    import torch
    def step(x):
        return (x.sin() * 5).sum(1)
    compiled = torch.compile(step, backend="torchtpu")
    for width in (5, 40):
        x = torch.randn(3, width)
        torch._dynamo.mark_dynamic(x, 1)
        torch.testing.assert_close(compiled(x), step(x))
""")

_CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                   "--disable-background-networking", "--disable-component-update",
                   "--disable-sync", "--virtual-time-budget=15000", "--dump-dom"]


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "the browser test needs Debian's chromium: apt-get install -y chromium " \
                  "(make test-full installs it)"
    return found


def test_report_page_renders_its_sections_and_plots_in_a_browser(tmp_path):
    trace = tmp_path / "trace"
    env = dict(os.environ, TORCH_TRACE=str(trace), TORCHTPU_CACHE_DIR=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-c", _RUN], env=env, check=True, timeout=300)
    page = tmp_path / "report.html"
    subprocess.run([sys.executable, "-m", "torchtpu_compile.report", str(trace), "-o",
                    str(page)], env=env, check=True, timeout=120)

    browser = subprocess.run(
        [_chromium(), *_CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
         page.as_uri()], capture_output=True, text=True, timeout=120)
    dom = browser.stdout
    assert "torchtpu compile report" in dom, browser.stderr[-2000:]
    for section in report.SECTIONS:
        assert f'id="{section}"' in dom
    # plotly drew each figure: an SVG inside every plot's div (a failed script leaves none).
    plots = re.findall(r'class="plotly-graph-div[ "]', dom)
    drawn = re.findall(r'<svg class="main-svg"', dom)
    assert len(plots) == 3 and len(drawn) >= len(plots)
    assert "graph_0/forward" in dom or "graph_0/inference" in dom
