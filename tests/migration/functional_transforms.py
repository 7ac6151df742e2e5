"""torch.func and torch.autograd.functional as CUDA users write them: per-sample gradients
(``vmap(grad(...))`` over ``functional_call``), a Jacobian and a Hessian-vector product.

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"

``main(device)`` runs it and returns what tests/migration/test_scripts.py compares against the
same script on CPU.

Run it alone: ``python -m tests.migration.functional_transforms tpu``.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, jacrev, vmap


def main(device: str = "cuda") -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 3)).to(device)
    params = {k: v.detach() for k, v in model.named_parameters()}
    # Data made on the host: a device generator draws other numbers than the CPU one.
    x = torch.randn(6, 5).to(device)
    y = torch.randint(0, 3, (6,)).to(device)

    # Per-sample gradients: the torch.func tutorial's recipe.
    def loss_of(params, sample, target):
        out = functional_call(model, params, (sample.unsqueeze(0),))
        return F.cross_entropy(out, target.unsqueeze(0))

    per_sample = vmap(grad(loss_of), in_dims=(None, 0, 0))(params, x, y)

    # torch.autograd.functional on a small function of a vector.
    def f(v):
        return torch.stack([v.sin().sum(), (v * v).prod(), v.exp().mean()])

    v = torch.randn(4).to(device)
    jacobian = torch.autograd.functional.jacobian(f, v)
    hvp = torch.autograd.functional.hvp(lambda z: z.pow(3).sum(), v, torch.ones_like(v))[1]
    batched_jac = vmap(jacrev(torch.sin))(torch.randn(3, 4).to(device))
    return {
        "per_sample": {k: g.cpu() for k, g in per_sample.items()},
        "jacobian": jacobian.cpu(),
        "hvp": hvp.cpu(),
        "batched_jacobian": batched_jac.cpu(),
    }


if __name__ == "__main__":
    print({k: getattr(v, "shape", None) for k, v in main(*sys.argv[1:2]).items()})
