"""Autograd as PyTorch's tutorials teach it beyond ``loss.backward()``: forward-mode AD with
dual numbers, a custom ``autograd.Function`` whose backward is itself differentiable (double
backward), and "what is torch.nn really?": a model trained with hand-made weights.

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"

What it exercises: ``torch.autograd.forward_ad`` (``dual_level``, ``make_dual``,
``unpack_dual``) through a small network and a ``functional_call`` with dual parameters, a
custom ``Function`` with ``save_for_backward`` checked with ``gradcheck``-style double
backward (``torch.autograd.grad(..., create_graph=True)`` twice), and logistic regression
written by hand: weights from ``randn / sqrt(n)`` with ``requires_grad_()``, ``log_softmax``
with a hand-written negative log likelihood (``input[range(n), target]``), updates under
``no_grad`` (``weights -= weights.grad * lr``) and ``grad.zero_()``, accuracy from ``argmax``.
``main(device)`` runs it and returns what tests/migration/test_scripts.py compares against the
same script on CPU.

Run it alone: ``python -m tests.migration.autograd_recipes tpu``.
"""
from __future__ import annotations

import math
import sys

import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.func import functional_call


class Cube(torch.autograd.Function):
    """x ** 3 with a backward written in differentiable ops, so it has a double backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, grad_out):
        x, = ctx.saved_tensors
        return grad_out * 3 * x ** 2


class ScaledTanh(torch.autograd.Function):
    """tanh(x) * s, saving its output (not its input) as the double-backward tutorial's
    example does: a saved output keeps its place in the graph, so the backward is
    differentiable."""

    @staticmethod
    def forward(ctx, x, scale):
        result = torch.tanh(x) * scale
        ctx.save_for_backward(result)
        ctx.scale = scale
        return result

    @staticmethod
    def backward(ctx, grad_out):
        result, = ctx.saved_tensors
        return grad_out * (ctx.scale - result * result / ctx.scale), None


def forward_mode(device):
    primal = torch.randn(5).to(device)
    tangent = torch.randn(5).to(device)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(),
                                torch.nn.Linear(4, 2)).to(device)
    with fwAD.dual_level():
        dual = fwAD.make_dual(primal, tangent)
        out = model(dual)
        jvp_input = fwAD.unpack_dual(out).tangent
        # Tangents of the parameters instead: dual parameters through functional_call.
        params = {name: p.detach() for name, p in model.named_parameters()}
        tangents = {name: torch.ones_like(p) for name, p in params.items()}
        dual_params = {name: fwAD.make_dual(p, tangents[name]) for name, p in params.items()}
        out = functional_call(model, dual_params, (primal,))
        jvp_params = fwAD.unpack_dual(out).tangent
        exp_dual = torch.exp(fwAD.make_dual(primal, tangent))
        primal_out, tangent_out = fwAD.unpack_dual(exp_dual)
    return {"jvp_input": jvp_input.cpu(), "jvp_params": jvp_params.cpu(),
            "exp": primal_out.cpu(), "exp_tangent": tangent_out.cpu()}


def double_backward(device):
    x = torch.randn(6).to(device).requires_grad_()
    y = Cube.apply(x).sum()
    (first,) = torch.autograd.grad(y, x, create_graph=True)
    (second,) = torch.autograd.grad(first.sum(), x, create_graph=True)
    (third,) = torch.autograd.grad(second.sum(), x)
    z = torch.randn(3, 4).to(device).requires_grad_()
    w = ScaledTanh.apply(z, 2.5)
    (gz,) = torch.autograd.grad(w.sum(), z, create_graph=True)
    gz.pow(2).sum().backward()
    return {"first": first.detach().cpu(), "second": second.detach().cpu(),
            "third": third.cpu(), "tanh_grad": gz.detach().cpu(), "tanh_ggrad": z.grad.cpu()}


def nn_really(device, epochs=2, n=32, bs=8):
    features, classes = 20, 4
    x_train = torch.randn(n, features)
    y_train = torch.randint(0, classes, (n,))
    x_train, y_train = x_train.to(device), y_train.to(device)
    weights = torch.randn(features, classes) / math.sqrt(features)
    weights = weights.to(device).requires_grad_()
    bias = torch.zeros(classes, device=device, requires_grad=True)

    def model(xb):
        return F.log_softmax(xb @ weights + bias, dim=-1)

    def nll(inp, target):
        return -inp[range(target.shape[0]), target].mean()

    def accuracy(out, yb):
        return (torch.argmax(out, dim=1) == yb).float().mean()

    lr, losses = 0.5, []
    for _ in range(epochs):
        for i in range((n - 1) // bs + 1):
            xb, yb = x_train[i * bs:i * bs + bs], y_train[i * bs:i * bs + bs]
            loss = nll(model(xb), yb)
            loss.backward()
            with torch.no_grad():
                weights -= weights.grad * lr
                bias -= bias.grad * lr
                weights.grad.zero_()
                bias.grad.zero_()
            losses.append(loss.item())
    out = model(x_train)
    return {"losses": losses, "accuracy": accuracy(out, y_train).item(),
            "final_loss": nll(out, y_train).item(), "cross_entropy_agrees":
            torch.allclose(F.cross_entropy(x_train @ weights + bias, y_train),
                           nll(out, y_train)),
            "weights": weights.detach().cpu(), "bias": bias.detach().cpu()}


def main(device: str = "cuda") -> dict:
    torch.manual_seed(0)
    return {"forward_mode": forward_mode(device), "double_backward": double_backward(device),
            "nn_really": nn_really(device)}


if __name__ == "__main__":
    print(main(*sys.argv[1:2])["nn_really"]["losses"])
