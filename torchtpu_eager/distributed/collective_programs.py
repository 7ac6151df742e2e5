"""Collective programs for the PJRT transport: the builders of ``torchtpu_compile.lower.
collectives`` compiled through the one runtime (the same executable cache, keyed by the text's
fingerprint and the group's devices), once per collective, signature and group.

Example::

    exe = compiled("all_reduce", (((4, 3), torch.float32),), devices=(0, 2048),
                   reduce="add", average=False)
    [out] = exe.run([buffer])
"""
from __future__ import annotations

import hashlib
import threading

from torchtpu_compile.lower.collectives import module_text
from torchtpu_compile.runtime.executable import compile_stablehlo

_compiled: dict = {}
_lock = threading.Lock()


def compiled(name: str, signature, devices: tuple, **params):
    """The executable of collective ``name`` on ``signature`` for the group on ``devices``."""
    key = (name, signature, devices, tuple(sorted(params.items())))
    exe = _compiled.get(key)
    if exe is None:
        text = module_text(name, len(devices), signature, **params)
        fingerprint = hashlib.sha256(text.encode()).hexdigest()
        exe = compile_stablehlo(text.encode(), fingerprint, "collective",
                                what=f"tpu_dist {name}", replicas=devices)
        with _lock:
            exe = _compiled.setdefault(key, exe)
    return exe
