"""The long differential fuzzing sweep (tests/support/fuzz.py): 240 random programs of 6 ops,
each on all four paths (compile, compile with dynamic=True, the tpu device strict and in
defer-and-fuse mode), in chunks of 20 seeds so a failure names its chunk; and 40 training programs
of ``--generation 4`` (layers, a loss, every input's gradient compared) on compile, eager and
fuse. A mismatch prints the
program; ``python -m tests.support.fuzz --seeds N --paths P --minimize`` shrinks it.

Mismatches that are PyTorch's own come back accepted (``fuzz.ACCEPTED``: each class has a
reference backend that must give our outcome on the same program); ``KNOWN`` lists the ones
this sweep expects, so a new seed in an accepted class is shown, not passed over."""
from __future__ import annotations

import io

import pytest

from tests.support import fuzz

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_dynamo")]

CHUNKS = [range(start, start + 20) for start in range(1000, 1240, 20)]

#: (seed, path) -> the accepted class (fuzz.ACCEPTED, where each says why) of its difference.
KNOWN = {
    **{(1014, p): "overlapping_write" for p in fuzz.COMPILE_PATHS},
    **{(1101, p): "overlapping_write" for p in fuzz.COMPILE_PATHS},
    **{(1037, p): "dynamo_meta_check" for p in fuzz.COMPILE_PATHS},
    **{(1171, p): "dynamo_meta_check" for p in fuzz.COMPILE_PATHS},
    **{(1108, p): "dead_op" for p in fuzz.COMPILE_PATHS},
    **{(1110, p): "restart_lost_write" for p in fuzz.COMPILE_PATHS},
    **{(1126, p): "restart_lost_write" for p in fuzz.COMPILE_PATHS},
}


@pytest.mark.parametrize("seeds", CHUNKS, ids=[f"{c.start}-{c.stop}" for c in CHUNKS])
def test_random_programs_match_eager_on_every_path(seeds):
    out = io.StringIO()
    found = fuzz.sweep(seeds, list(fuzz.PATHS), ops=6, out=out)
    assert not [m for m in found if not m.accepted], out.getvalue()
    accepted = {(m.seed, m.path): m.accepted.split(":")[0] for m in found if m.accepted}
    expected = {k: v for k, v in KNOWN.items() if k[0] in seeds}
    assert accepted == expected, out.getvalue()


#: Training programs (fuzz.TRAINING): the paths the sweep of docs/reliability.md ran them on.
#: Seeds 6002 (eager's batch_norm misread), 6015-6017 (conv_transpose output_padding) and
#: 6086, 6088 (float64 upsampling backwards) among them.
TRAINING_CHUNKS = [range(6000, 6020), range(6080, 6100)]
TRAINING_PATHS = ("compile", "eager", "fuse")
#: (seed, path) -> the accepted class of its difference, as KNOWN.
TRAINING_KNOWN: dict = {}


@pytest.mark.parametrize("seeds", TRAINING_CHUNKS, ids=[f"{c.start}-{c.stop}"
                                                        for c in TRAINING_CHUNKS])
def test_training_programs_match_eager_values_and_gradients(seeds):
    out = io.StringIO()
    found = fuzz.sweep(seeds, list(TRAINING_PATHS), ops=6, out=out, generation=fuzz.TRAINING)
    assert not [m for m in found if not m.accepted], out.getvalue()
    accepted = {(m.seed, m.path): m.accepted.split(":")[0] for m in found if m.accepted}
    expected = {k: v for k, v in TRAINING_KNOWN.items() if k[0] in seeds}
    assert accepted == expected, out.getvalue()
