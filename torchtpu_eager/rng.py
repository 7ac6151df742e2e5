"""The tpu device's random number generator.

Random ops run on the host, drawn from a generator of their own: results follow
``torch.tpu.manual_seed`` and do not move the CPU generator, and a seed gives the same numbers
on every platform. An op given ``generator=torch.Generator("tpu")`` draws from that one
instead (its state is a CPU generator's, csrc/native.cpp), with the numbers of a CPU generator
given the same seed. (TPUs draw on device in other stacks; here reproducibility across platforms
wins, and masks are small next to the matmuls they gate.)

Example::

    torch.tpu.manual_seed(0)
    a = torch.rand(3, device="tpu")
"""
from __future__ import annotations

import contextlib
import functools
import threading

import torch

from .device import NAME, check_device

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
def drawing_on_host(func, args, kwargs):
    """Run a tpu random op's host draw as the device would: from the tpu generator it is given
    (``generator=g``, ``g = torch.Generator("tpu")``), else from the default tpu generator.
    Yields the op to run on the host and its ``(args, kwargs)``, each tpu generator replaced
    by a CPU one holding its state; the tpu generator gets the advanced state back, so its
    draws are a CPU generator's with the same seed. A CPU generator is refused, as a CUDA op
    refuses one. Given none, the op draws from the default tpu generator passed to it
    (``_with_generator``): swapping its state into torch's default CPU generator instead let
    another thread's CPU draws take the tpu stream's numbers.

    Example::

        with drawing_on_host(func, args, kwargs) as (func, host_args, host_kwargs):
            out = func(*host_args, **host_kwargs)
    """
    given = {}   # id of a tpu generator -> (it, the CPU generator that draws for it)

    def on_host(value):
        if type(value) is not torch.Generator:  # isinstance: a Python metaclass hook
            return value
        if value.device.type != NAME:
            raise RuntimeError(f"Expected a '{NAME}' device type for generator but found "
                               f"'{value.device.type}'")
        if id(value) not in given:   # one generator passed twice draws from one state
            host = torch.Generator()
            host.set_state(value.get_state())
            given[id(value)] = (value, host)
        return given[id(value)][1]

    host_args = tuple(on_host(a) for a in args)
    host_kwargs = {k: on_host(v) for k, v in kwargs.items()}
    try:
        if given or torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()):
            yield func, host_args, host_kwargs
        else:
            drawing = _with_generator(func, host_args, host_kwargs)
            if drawing is not None:
                yield drawing
            else:
                with drawing_from_tpu_generator():
                    yield func, host_args, host_kwargs
    finally:
        for tpu, host in given.values():
            tpu.set_state(host.get_state())


def _with_generator(func, args, kwargs):
    """``(op, args, kwargs)`` drawing from the default tpu generator by ``generator=``: the
    op's own argument, or its overload that takes one (``randn.default`` has
    ``randn.generator``); None where neither exists (dropout inside fused kernels)."""
    found = _generator_overload(func)
    if found is None:
        return None
    op, position = found
    if position < len(args):
        if args[position] is not None:
            return None
        args = args[:position] + (_generator,) + args[position + 1:]
    elif kwargs.get("generator") is not None:
        return None
    else:
        kwargs = {**kwargs, "generator": _generator}
    return op, args, kwargs


@functools.cache
def _generator_overload(func):
    """``(op, position of its generator argument)``: ``func`` if it takes a generator, else
    its overload taking the same arguments and a generator; None if neither exists."""
    names = {a.name for a in func._schema.arguments}
    candidates = [func] if "generator" in names else \
        [getattr(func.overloadpacket, name) for name in func.overloadpacket.overloads()]
    for op in candidates:
        arguments = [a.name for a in op._schema.arguments]
        if set(arguments) == names | {"generator"}:
            return op, arguments.index("generator")
    return None


_swap_lock = threading.Lock()


@contextlib.contextmanager
def drawing_from_tpu_generator():
    """Run host random ops that take no ``generator`` argument from the tpu generator: its
    state swapped into torch's default CPU generator, one thread at a time (a thread drawing
    on the CPU meanwhile still draws from the swapped state: only ops with no generator
    argument, such as an RNN's fused dropout, come here)."""
    with _swap_lock:
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
