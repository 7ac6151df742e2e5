"""Which padded size (bucket) serves a real size, and when a graph gets a new bucket.

A policy maps one real size to its canonical bucket. A graph with several dynamic dims keys its
programs by the tuple of buckets; ``choose`` caps how many such programs one graph builds.

Policies (``torchtpu_compile.config.bucket_policy``):

- ``"pow2-128"`` (default): powers of two from ``bucket_min`` up to 128, multiples of 128 above;
- ``"pow2"``: powers of two from ``bucket_min``;
- ``"multiple-N"``: multiples of N (e.g. ``"multiple-64"``);
- ``"16,64,256"``: an explicit ladder; sizes past its end take multiples of its last rung;
- a callable ``size -> bucket`` (any int >= size).
"""
from __future__ import annotations

import math

from .. import config


def _pow2(size: int, smallest: int) -> int:
    return max(smallest, 1 << max(0, (size - 1).bit_length()))


def _round_up(size: int, step: int) -> int:
    # integer division: a float's 53 bits rounded 2**53 + 1 down to a bucket below it
    return max(step, -(-size // step) * step)


def bucket_size(size: int, policy=None) -> int:
    """The canonical bucket for a real ``size`` under ``policy`` (default: the config's).

    Example::

        >>> bucket_size(100, "pow2-128"), bucket_size(300, "pow2-128")
        (128, 384)
    """
    policy = config.bucket_policy if policy is None else policy
    smallest = max(1, int(config.bucket_min))
    if callable(policy):
        bucket = int(policy(size))
    elif policy == "pow2-128":
        bucket = _pow2(size, smallest) if size <= 128 else _round_up(size, 128)
    elif policy == "pow2":
        bucket = _pow2(size, smallest)
    elif isinstance(policy, str) and policy.startswith("multiple-"):
        bucket = _round_up(size, int(policy.split("-", 1)[1]))
    elif isinstance(policy, str) and "," in policy or isinstance(policy, (list, tuple)):
        rungs = sorted(int(r) for r in (policy.split(",") if isinstance(policy, str) else policy))
        bucket = next((r for r in rungs if r >= size), None)
        if bucket is None:
            step = rungs[-1] - (rungs[-2] if len(rungs) > 1 else 0)
            bucket = rungs[-1] + _round_up(size - rungs[-1], step)
    else:
        raise ValueError(
            f"torchtpu_compile.config.bucket_policy={policy!r} is not a policy: use 'pow2-128', "
            f"'pow2', 'multiple-N', a comma-separated ladder such as '16,64,256', or a "
            f"callable size -> bucket")
    if bucket < size:
        raise ValueError(f"bucket policy {policy!r} gave {bucket} for size {size}; a bucket "
                         f"must be at least the size it serves")
    return bucket


def bucket_of(value: int) -> int:
    """The bucket slot for a dynamic int: ``bucket_size`` of a size, and a negative value (an
    int argument such as an index, ``x[s]`` with ``s = -2``) itself. A negative index counts
    from the end, so no other value can stand for it, and its sign decides the program
    Dynamo traced (it guards the sign).

    Example::

        >>> bucket_of(5), bucket_of(-2)
        (8, -2)
    """
    return value if value < 0 else bucket_size(value)


def next_bucket(slot: int) -> int:
    """The bucket after ``slot`` (a negative slot is one value: itself)."""
    return slot if slot < 0 else bucket_size(slot + 1)


def _covers(key: tuple, sizes: tuple) -> bool:
    return all(k == s if s < 0 else k >= s for k, s in zip(key, sizes))


def _volume(key: tuple) -> int:
    return math.prod(key)


def choose(sizes: tuple, existing) -> tuple[tuple, bool]:
    """(bucket key for real ``sizes``, whether it is new) given the keys a graph already has.

    Under ``config.max_buckets`` a graph gets the canonical bucket of each size. The last slot
    goes to a bucket covering everything seen so far (the elementwise maximum), so that a graph
    with several dynamic dims stops compiling; past the cap, sizes reuse the smallest covering
    bucket, and only a size beyond every bucket compiles a new one (logged).

    Example::

        >>> choose((100,), [])
        ((128,), True)
    """
    canonical = tuple(bucket_of(s) for s in sizes)
    existing = list(existing)
    if canonical in existing:
        return canonical, False
    covering = [k for k in existing if _covers(k, sizes)]
    cap = max(1, int(config.max_buckets))
    if len(existing) < cap - 1 or (len(existing) < cap and len(sizes) == 1):
        return canonical, True
    if covering:
        return min(covering, key=_volume), False
    high_water = tuple(c if c < 0 else max(c, *(k[i] for k in existing if k[i] >= 0))
                       for i, c in enumerate(canonical))
    return high_water, True
