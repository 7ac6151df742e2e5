"""What happens when an op cannot run through XLA: the one strict / count / warn policy.

Both front ends that can run an op elsewhere use it: a compiled graph cut around the op (it runs
in eager PyTorch between XLA regions, ``program/build.py``) and the eager tpu device (the op
runs on the host, ``torchtpu_eager/fallback.py``). With ``config.strict`` (``TORCHTPU_STRICT=1``)
it is an ``UnsupportedOpError`` naming the op, its inputs and where it came from; otherwise it is
counted per op in ``stats()["fallback_ops"]`` and warned about once per op.

Example::

    fall_back("aten.nonzero.default", "aten.nonzero.default(f32[4])", "data-dependent shape",
              path="eager")
    # logged once: "torchtpu: aten.nonzero.default(f32[4]) runs on the host, not the tpu ..."
"""
from __future__ import annotations

from . import config, counters
from ._logging import warn_once
from .errors import UnsupportedOpError

#: Per path: (what the op cannot do, what unsetting strict lets it do, where it runs instead).
_WORDS = {
    "compile": ("cannot run through XLA", "fall back to eager PyTorch",
                "runs in eager PyTorch, not XLA"),
    "eager": ("cannot run on the tpu device", "run on the host",
              "runs on the host, not the tpu device"),
}


def fall_back(op: str, description: str, reason: str, *, path: str) -> None:
    """Apply the policy to one op about to run outside XLA: raise under strict, else count and
    warn once per (path, op).

    ``op`` names the op (the counter's key), ``description`` says it with its inputs and source
    line for messages, ``reason`` why it cannot be lowered; ``path``: "compile" or "eager".
    """
    cannot, allowed, instead = _WORDS[path]
    if config.strict:
        raise UnsupportedOpError(
            f"TORCHTPU_STRICT=1: {description} {cannot} ({reason}). Unset TORCHTPU_STRICT to "
            f"let it {allowed}.")
    counters.count_fallback(op)
    warn_once((path, "fallback", op), "torchtpu: %s %s: %s", description, instead, reason)
