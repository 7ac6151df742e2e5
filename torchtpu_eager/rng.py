"""The tpu device's random number generator.

Random ops run on the host, drawn from a generator of their own: results follow
``torch.tpu.manual_seed`` and do not move the CPU generator, and a seed gives the same numbers
on every platform. (TPUs draw on device in other stacks; here reproducibility across platforms
wins, and masks are small next to the matmuls they gate.)

Example::

    torch.tpu.manual_seed(0)
    a = torch.rand(3, device="tpu")
"""
from __future__ import annotations

import contextlib

import torch

_generator = torch.Generator()
_initial_seed = _generator.seed()


def generator() -> torch.Generator:
    return _generator


def manual_seed(seed: int) -> None:
    global _initial_seed
    _initial_seed = int(seed)
    _generator.manual_seed(int(seed))


def seed() -> int:
    global _initial_seed
    _initial_seed = _generator.seed()
    return _initial_seed


def initial_seed() -> int:
    return _initial_seed


def get_rng_state() -> torch.Tensor:
    return _generator.get_state()


def set_rng_state(state: torch.Tensor) -> None:
    _generator.set_state(state)


@contextlib.contextmanager
def drawing_from_tpu_generator():
    """Run host random ops that take no ``generator`` argument from the tpu generator."""
    cpu = torch.random.default_generator
    saved = cpu.get_state()
    cpu.set_state(_generator.get_state())
    try:
        yield
    finally:
        _generator.set_state(cpu.get_state())
        cpu.set_state(saved)
