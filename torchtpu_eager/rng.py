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

from .device import check_device

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


def get_rng_state(device="tpu") -> torch.Tensor:
    """The generator's state (``device``: the one tpu device, as ``torch.cuda`` takes it).

    Example::

        state = torch.tpu.get_rng_state()
        a = torch.rand(3, device="tpu")
        torch.tpu.set_rng_state(state)
        b = torch.rand(3, device="tpu")      # equal to a
    """
    check_device(device)
    return _generator.get_state()


def set_rng_state(state: torch.Tensor, device="tpu") -> None:
    check_device(device)
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


def register_replay_ops(tensor_type) -> None:
    """Run the RNG state ops of compiled graphs on ``tensor_type`` (tpu) tensors.

    aot_autograd gives a recomputed random op (dropout in a checkpointed block) the state it
    drew from in the forward: ``run_and_save_rng_state`` returns the generator's state with the
    op's result, ``run_with_rng_state`` replays the op from that state. PyTorch implements them
    per device (CPU, CUDA, ...): for the tpu they read and set this generator.
    """
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

    @run_and_save_rng_state.py_impl(tensor_type)
    def run_and_save(op, *args, **kwargs):
        return get_rng_state(), op(*args, **kwargs)

    @run_with_rng_state.py_impl(tensor_type)
    def run_with(rng_state, op, *args, **kwargs):
        current = get_rng_state()
        set_rng_state(rng_state.cpu())
        try:
            return op(*args, **kwargs)
        finally:
            set_rng_state(current)
