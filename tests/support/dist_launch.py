"""Start a group of worker processes on loopback with a deadline (for the tpu_dist tests).

Example::

    results = launch("collectives", world=2, deadline=150)
    assert all(r.returncode == 0 for r in results)
"""
from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import time

from tests.support import python_env



@dataclasses.dataclass
class Result:
    rank: int
    returncode: int | None   # None: killed at the deadline
    output: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(case: str, world: int = 2, deadline: float = 150.0, env: dict | None = None):
    """Run ``tests.support.dist_workers CASE`` on ``world`` ranks; kill any still running at the
    deadline."""
    port = free_port()
    environment = python_env(**(env or {}), PYTHONUNBUFFERED="1")
    procs = [subprocess.Popen([sys.executable, "-m", "tests.support.dist_workers", case, str(rank),
                               str(world), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=environment)
             for rank in range(world)]
    end = time.monotonic() + deadline
    results = []
    for rank, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=max(end - time.monotonic(), 0.1))
            results.append(Result(rank, proc.returncode, out))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            results.append(Result(rank, None, out))
    return results


def check(results, expect: str = "ok") -> None:
    """Fail with every rank's output unless every rank exited 0 and printed ``expect``."""
    bad = [r for r in results if r.returncode != 0 or expect not in r.output]
    if bad:
        report = "\n".join(f"--- rank {r.rank} (exit {r.returncode}) ---\n{r.output[-3000:]}"
                           for r in results)
        raise AssertionError(f"{len(bad)} rank(s) failed or timed out:\n{report}")
