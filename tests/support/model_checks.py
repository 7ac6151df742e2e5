"""A model trained compiled (backend="torchtpu") and eagerly from the same start, compared.

The reference is a deepcopy of the model run eagerly with the same inputs, targets and optimizer.
Under "highest" precision both sides compute in fp32 and agree to fp32 rounding; under "medium"
the backend rounds matmul and convolution operands to bf16, so agreement is bf16-level.

Example::

    model, inputs = zoo.TRANSFORMERS["gpt2"]()
    check_model("gpt2", model, inputs, "highest", steps=3)
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu_compile
from tests.support import zoo


@dataclass(frozen=True)
class Tol:
    rtol: float
    atol: float  # a fraction of the reference's max abs value (of all tensors, for a dict)


# highest: observed errors are <= 3e-6 of the scale; the bounds leave room for reduction-order
# noise and still catch a wrong op. medium: bf16 operand rounding gives up to ~2e-2 of the scale
# on gradients (the CNN, CLIP), ~5e-3 on outputs.
TOLERANCES = {
    "highest": dict(out=Tol(1e-4, 1e-5), loss=Tol(1e-4, 0), grad=Tol(1e-3, 1e-4),
                    delta=Tol(1e-3, 1e-4)),
    "medium": dict(out=Tol(0, 3e-2), loss=Tol(3e-2, 0), grad=Tol(0, 5e-2), delta=Tol(0, 5e-2)),
}

# T5's unscaled attention makes its gradients bf16-sensitive: eager torch.autocast(bfloat16) is
# off from fp32 by 8e-2 of the scale too, as is "medium".
LOOSER = {("medium", "t5"): dict(grad=Tol(0, 0.2), delta=Tol(0, 0.2))}


def tolerances(precision: str, name: str) -> dict:
    return {**TOLERANCES[precision], **LOOSER.get((precision, name), {})}


# Losses then move by 5-40% per step (far beyond the loss tolerance, so a program that kept
# stale parameters is caught) while training stays smooth; at 0.5 some models oscillate and
# amplify bf16 differences. SGD, not Adam: Adam's normalisation blows rounding noise in zero
# gradients (attention key biases) up to full-size updates.
LR = 0.1


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    expected = expected.detach().float()
    return ((actual.detach().float() - expected).abs().max() / expected.abs().max()).item()


def assert_close(actual, expected, tol: Tol, what: str, scale: float | None = None):
    expected = expected.detach().float()
    if scale is None:
        scale = expected.abs().max().item()
    torch.testing.assert_close(actual.detach().float(), expected, rtol=tol.rtol,
                               atol=tol.atol * scale, msg=lambda m: f"{what}: {m}")


def assert_all_close(actual: dict, expected: dict, tol: Tol, what: str):
    # One scale for all tensors: gradients that are zero in exact arithmetic (attention key
    # biases) are pure rounding noise on both sides and must not be compared relatively.
    assert actual.keys() == expected.keys(), what
    scale = max((e.detach().float().abs().max().item() for e in expected.values()), default=0.0)
    for name in expected:
        assert_close(actual[name], expected[name], tol, f"{what} {name}", scale=scale)


def assert_ran_on_torchtpu():
    """Something went through torchtpu since the last call, and nothing fell back to eager."""
    stats = torchtpu_compile.stats()
    torchtpu_compile.reset_stats()
    assert stats["graphs_compiled"] + stats["cache_hits"] > 0, "Dynamo ran the model eagerly"
    assert stats["fallback_ops"] == {}


def no_dropout(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model


def loss_of(output) -> torch.Tensor:
    """Cross-entropy of the main output's last dim against fixed random targets."""
    logits = zoo.first_tensor(output).float().flatten(0, -2)
    generator = torch.Generator().manual_seed(0)
    targets = torch.randint(logits.shape[-1], logits.shape[:-1], generator=generator)
    return F.cross_entropy(logits, targets)


@dataclass
class Run:
    losses: list        # one per step
    output: torch.Tensor    # main output of the first step
    grads: dict         # after the first step
    deltas: dict        # parameter change over all steps
    buffers: dict       # after all steps (BatchNorm running stats and step count)


def train(model: nn.Module, inputs, steps: int, compiled: bool) -> Run:
    step = torch.compile(model, backend="torchtpu") if compiled else model
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for i in range(steps):
        optimizer.zero_grad()
        output = step(*inputs)
        loss = loss_of(output)
        loss.backward()
        losses.append(loss.detach())
        if i == 0:
            first_output = zoo.first_tensor(output).detach()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
    deltas = {n: p.detach() - start[n] for n, p in model.named_parameters()}
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    return Run(losses, first_output, grads, deltas, buffers)


def check_inference(model: nn.Module, inputs, precision: str, tol: dict):
    model.eval()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="torchtpu")
    with torch.no_grad():
        actual = zoo.first_tensor(compiled(*inputs))
        expected = zoo.first_tensor(reference(*inputs))
    assert_ran_on_torchtpu()
    assert_close(actual, expected, tol["out"], "inference output")
    if precision == "medium":
        # fp32-exact results under "medium" mean the bf16 emulation did nothing.
        assert rel_err(actual, expected) > 1e-4


def check_training(model: nn.Module, inputs, tol: dict, steps: int):
    model.train()
    reference = copy.deepcopy(model)
    actual = train(model, inputs, steps, compiled=True)
    assert_ran_on_torchtpu()
    expected = train(reference, inputs, steps, compiled=False)
    assert_close(actual.output, expected.output, tol["out"], "first training step output")
    assert_close(torch.stack(actual.losses), torch.stack(expected.losses), tol["loss"], "losses")
    assert_all_close(actual.grads, expected.grads, tol["grad"], "first step grad")
    assert_all_close(actual.deltas, expected.deltas, tol["delta"], "parameter change")
    assert_all_close(actual.buffers, expected.buffers, tol["out"], "buffer")


def check_model(name: str, model: nn.Module, inputs, precision: str, steps: int):
    no_dropout(model)
    tol = tolerances(precision, name)
    check_inference(model, inputs, precision, tol)
    check_training(model, inputs, tol, steps)
