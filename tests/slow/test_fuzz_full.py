"""The long differential fuzzing sweep (tests/support/fuzz.py): 240 random programs of 6 ops,
each on all four paths (compile, compile with dynamic=True, the tpu device strict and in
defer-and-fuse mode), in chunks of 20 seeds so a failure names its chunk. A mismatch prints the
program; ``python -m tests.support.fuzz --seeds N --paths P --minimize`` shrinks it."""
from __future__ import annotations

import io

import pytest

from tests.support import fuzz

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_dynamo")]

CHUNKS = [range(start, start + 20) for start in range(1000, 1240, 20)]


@pytest.mark.parametrize("seeds", CHUNKS, ids=[f"{c.start}-{c.stop}" for c in CHUNKS])
def test_random_programs_match_eager_on_every_path(seeds):
    out = io.StringIO()
    found = fuzz.sweep(seeds, list(fuzz.PATHS), ops=6, out=out)
    assert not found, out.getvalue()
