"""Activation checkpointing on the tpu device and in compiled graphs, against eager CPU PyTorch.

Run in a subprocess by test_checkpoint.py (an abort must fail a test, not end pytest):
``python -m tests.support.checkpoint_worker eager`` (the eager mode comes from the environment)
or ``python -m tests.support.checkpoint_worker compile``. Prints ``ok <case>`` per case,
``FAIL <case>: <why>`` for a case whose results differ, and exits non-zero if any case failed.
"""
from __future__ import annotations

import copy
import sys
import traceback

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import torchtpu_compile
import torchtpu_eager  # noqa: F401  (the tpu device)

torchtpu_compile.config.matmul_precision = "highest"  # fp32 products, as on the CPU


class Block(nn.Module):
    def __init__(self, dropout: float):
        super().__init__()
        self.up = nn.Linear(6, 12)
        self.down = nn.Linear(12, 6)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.down(self.dropout(torch.relu(self.up(x))))


class Net(nn.Module):
    """Two blocks, each checkpointed the way ``how`` says ("none": not at all), then a head."""

    def __init__(self, how: str, dropout: float):
        super().__init__()
        self.how = how
        self.blocks = nn.Sequential(Block(dropout), Block(dropout))
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        if self.how == "none":
            x = self.blocks(x)
        elif self.how == "sequential":
            x = checkpoint_sequential(self.blocks, 2, x, use_reentrant=False)
        else:
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=self.how == "reentrant")
        return self.head(x)


def _run(net: nn.Module, x: torch.Tensor, seed: int, step=None):
    """Loss and gradients (of the input and every parameter) of one step, on the host."""
    torch.manual_seed(seed)
    torch.tpu.manual_seed(seed)
    x = x.detach().clone().requires_grad_()
    loss = (net if step is None else step)(x).square().mean()
    loss.backward()
    grads = {"input": x.grad}
    grads.update({name: p.grad for name, p in net.named_parameters()})
    return loss.detach().cpu(), {k: v.detach().cpu() for k, v in grads.items()}


def _compare(got, want, case: str) -> None:
    loss, grads = got
    want_loss, want_grads = want
    torch.testing.assert_close(loss, want_loss, rtol=1e-4, atol=1e-5, msg=f"{case}: loss")
    for name, grad in want_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5,
                                   msg=f"{case}: gradient of {name}")


def _dropout_is_consistent(device: str, compiled: bool, how: str) -> None:
    """The backward used the forward's dropout mask: out = x * mask / (1 - p) * w, so
    d out.sum() / dw = out.sum(0) / w and d out.sum() / dx = out / x (x has no zeros)."""
    torch.manual_seed(1)
    w = nn.Parameter(torch.linspace(0.5, 1.5, 8, device=device))
    drop = nn.Dropout(0.5)

    def block(x):
        return drop(x) * w

    def f(x):
        return checkpoint(block, x, use_reentrant=how == "reentrant")

    x = (torch.rand(16, 8) + 0.5).to(device).requires_grad_()
    out = (torch.compile(f, backend="torchtpu") if compiled else f)(x)
    out.sum().backward()
    out, gx, gw = out.detach().cpu(), x.grad.cpu(), w.grad.cpu()
    torch.testing.assert_close(gw, out.sum(0) / w.detach().cpu(), msg="dL/dw")
    torch.testing.assert_close(gx, out / x.detach().cpu(), msg="dL/dx")


def eager_cases():
    """Without dropout, CPU's results; with dropout (whose tpu masks are drawn otherwise than
    CPU's), the results of the same tpu model without checkpointing: recomputation must
    restore the tpu generator and draw the forward's masks again."""
    x = torch.randn(5, 6)
    for how in ("reentrant", "non-reentrant", "sequential"):
        for dropout in (0.0, 0.3):
            case = f"eager {how} dropout={dropout}"
            torch.manual_seed(0)
            reference = Net(how if dropout == 0 else "none", dropout)
            if dropout:
                reference.to("tpu")
            on_tpu = copy.deepcopy(reference).to("tpu")
            on_tpu.how = how

            def check(reference=reference, on_tpu=on_tpu, case=case):
                want = _run(reference, x.to(next(reference.parameters()).device), seed=7)
                _compare(_run(on_tpu, x.to("tpu"), seed=7), want, case)
            yield case, check
    for how in ("reentrant", "non-reentrant"):
        yield f"eager {how} dropout mask reused", \
            lambda how=how: _dropout_is_consistent("tpu", False, how)


def compile_cases():
    x = torch.randn(5, 6)
    for device in ("cpu", "tpu"):
        for how in ("non-reentrant", "reentrant", "sequential"):
            case = f"compiled {how} on {device}"
            torch.manual_seed(0)
            reference = Net(how, 0.0)
            net = copy.deepcopy(reference).to(device)
            want = _run(reference, x, seed=7)

            def check(net=net, case=case, device=device, want=want):
                torch._dynamo.reset()
                compiled = torch.compile(net, backend="torchtpu")
                _compare(_run(net, x.to(device), seed=7, step=compiled), want, case)
            yield case, check
        for how in ("non-reentrant", "reentrant"):
            yield f"compiled {how} on {device} dropout mask reused", \
                lambda device=device, how=how: _dropout_is_consistent(device, True, how)


def main() -> int:
    cases = eager_cases() if sys.argv[1] == "eager" else compile_cases()
    failed = 0
    for case, check in cases:
        try:
            check()
            print(f"ok {case}", flush=True)
        except Exception as exc:  # one case's failure must not hide the others'
            failed += 1
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            print(f"FAIL {case}: {type(exc).__name__}: {first}", flush=True)
            traceback.print_exc()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
