"""Collective programs for the PJRT transport: the builders of ``torchtpu_compile.lower.
collectives``, through the program builder's compile half (``compile_program``: the same
executable cache, keyed by the text's fingerprint and the group's devices), once per
collective, signature and group. They have StableHLO, not a graph: buffers go straight in and
out (the identity calling convention).

Example::

    program = compiled("all_reduce", (((4, 3), torch.float32),), devices=(0, 2048),
                       reduce="add", average=False)
    [out] = program.run([buffer])
"""
from __future__ import annotations

import threading

from torchtpu_compile.lower.collectives import module_text
from torchtpu_compile.program.run import compile_program

_compiled: dict = {}
_lock = threading.Lock()


def compiled(name: str, signature, devices: tuple, **params):
    """The ``Program`` of collective ``name`` on ``signature`` for the group on ``devices``."""
    key = (name, signature, devices, tuple(sorted(params.items())))
    program = _compiled.get(key)
    if program is None:
        text = module_text(name, len(devices), signature, **params)
        program = compile_program(text, precision="collective", name=f"tpu_dist {name}",
                                  replicas=devices)
        with _lock:
            program = _compiled.setdefault(key, program)
    return program
