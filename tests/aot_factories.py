"""Factories for the AOT tests and CLI: each returns (model, example_inputs)."""
import torch

import zoo


def gpt2():
    model, (ids,) = zoo.gpt2()
    model.config.use_cache = False
    return model.eval(), (ids,)


def mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    return model.eval(), (torch.randn(5, 8),)
