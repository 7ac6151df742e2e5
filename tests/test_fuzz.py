"""Differential fuzzing (tests/support/fuzz.py): small random programs give eager CPU's results
on every path. A fixed set of seeds here, each program on one path in turn; the long sweep is
tests/slow/test_fuzz_full.py. The harness is tested too: a path that returns a wrong value,
accepts what eager rejects or skips an in-place write is caught, and the minimizer keeps the
line at fault."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import torchtpu_compile
from tests.support import fuzz

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

#: (seed, path): 30 programs of 4 ops, the paths taken in turn.
FAST_PATHS = ("compile", "eager", "fuse", "dynamic", "compile", "fuse")
FAST = [(seed, FAST_PATHS[seed % len(FAST_PATHS)]) for seed in range(30)]


@pytest.mark.parametrize("seed,path", FAST, ids=[f"{s}-{p}" for s, p in FAST])
def test_random_programs_match_eager(seed, path):
    # torchtpu's setting, not torch's global one, which later tests must find unset
    with torchtpu_compile.config.patch(matmul_precision="highest"):
        mismatch = fuzz.check(fuzz.program(seed, ops=4), path)
    assert mismatch is None, str(mismatch)


def _planted(change):
    """A path that runs the reference and then ``change(outputs, inputs)``."""
    def run(prog):
        out, inputs = fuzz._run_reference(prog)
        return change(list(out), inputs)
    return run


def _bump_last_element(out, inputs):
    t = out[-1].clone()
    t.view(-1)[-1] = ~t.view(-1)[-1] if t.dtype == torch.bool else t.view(-1)[-1] + 1
    return tuple(out[:-1]) + (t,), inputs


def _first_program(want):
    return next(p for p in map(fuzz.program, range(200)) if want(p))


def test_harness_catches_a_planted_wrong_value_and_minimizes_it():
    prog = _first_program(lambda p: not p.raises and len(p.lines) >= 4 and
                          fuzz._run_reference(p)[0][-1].numel() > 0)
    mismatch = fuzz.check(prog, "planted", run=_planted(_bump_last_element))
    assert mismatch is not None and "differ" in mismatch.what
    small = fuzz.minimize(mismatch, run=_planted(_bump_last_element))
    assert small.what.startswith("output") and "differ" in small.what
    assert len(small.prog.returns) == 1 and len(small.prog.lines) < len(prog.lines)


def test_harness_catches_a_missing_error_and_a_missing_in_place_write():
    def without_the_rejected_line(prog):
        return fuzz._run_reference(dataclasses.replace(prog, lines=prog.lines[:-1]))
    raising = _first_program(lambda p: p.raises)
    returned = fuzz.check(raising, "planted", run=without_the_rejected_line)
    assert returned is not None and returned.what.startswith("returned a value where eager")

    def reverted_inputs(out, inputs):
        return out, [t + 1 if t.dtype != torch.bool else ~t for t in inputs]
    prog = _first_program(lambda p: not p.raises and any(t.numel() for t in p.make_inputs()))
    stale = fuzz.check(prog, "planted", run=_planted(reverted_inputs))
    assert stale is not None and stale.what.startswith("input")


def test_compare_is_exact_for_integers_and_sees_nan_places():
    assert fuzz.compare(torch.tensor([7]), torch.tensor([8]), "o") is not None
    assert fuzz.compare(torch.tensor([float("nan"), 1.0]), torch.tensor([1.0, float("nan")]),
                        "o") is not None
    assert fuzz.compare(torch.tensor([float("nan"), -0.0]), torch.tensor([float("nan"), 0.0]),
                        "o") is None
    assert fuzz.compare(torch.tensor([1], dtype=torch.int32), torch.tensor([1]), "o") is not None
