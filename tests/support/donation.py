"""Shared by the donation tests (``tests/test_donation.py``, ``tests/slow/
test_donation_adamw.py``): a model on the CPU and its copy on the tpu device, a compiled
optimizer step, and the peak device memory of one step.

Example::

    cpu, tpu = models(layers=2, width=32)
    step = compiled_step(torch.optim.SGD(tpu.parameters(), lr=0.1))
"""
import copy
import gc

import torch

import torchtpu_compile
import torchtpu_eager  # noqa: F401  (registers the device; autoload does too)
from torchtpu_compile import config


def models(layers: int = 2, width: int = 32):
    """(a CPU model of ``layers`` Linear layers, its copy on the tpu device)."""
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    return cpu, copy.deepcopy(cpu).to("tpu")


def backward(model, x) -> None:
    model(x).square().mean().backward()


def compiled_step(optimizer):
    """``optimizer.step`` compiled with torchtpu (a graph that overwrites its inputs)."""
    @torch.compile(backend="torchtpu")
    def step():
        optimizer.step()
    return step


def donation() -> dict:
    return torchtpu_compile.stats()["donation"]


def peak_of_a_step(make_optimizer, donate: bool, layers: int = 2, width: int = 128) -> int:
    """Peak live device bytes over one compiled optimizer step (the second: its state made
    and nothing compiling), above the bytes live before it."""
    torch._dynamo.reset()
    with config.patch(donate_buffers=donate):
        _, tpu = models(layers=layers, width=width)
        step = compiled_step(make_optimizer(tpu.parameters()))
        x = torch.randn(4, width, device="tpu")
        for _ in range(2):
            backward(tpu, x)
            gc.collect()
            torch.tpu.synchronize()
            torch.tpu.reset_peak_memory_stats()
            before = torch.tpu.memory_allocated()
            step()
            peak = torch.tpu.max_memory_allocated() - before
    return peak
