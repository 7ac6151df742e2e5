"""A frame holding a C method descriptor is guarded on it (descriptor_guards.py)."""
from __future__ import annotations

import pytest
import torch

import torchtpu_compile

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _closure_over(op):
    return lambda a: op(a) * 2


class _Act(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.inner = torch.nn.Identity()
        self.inner.fn = fn

    def forward(self, a):
        return self.inner.fn(a) + 1


@pytest.mark.parametrize("holder", [_closure_over, _Act], ids=["closure", "submodule"])
def test_a_frame_called_with_another_tensor_method_traces_again(holder):
    # Dynamo does not guard torch.Tensor.sigmoid and the like: the second call ran relu's
    # graph, on every backend (torch 2.13)
    x = torch.randn(8)
    with torchtpu_compile.config.patch(dynamo_cache=False):  # Dynamo's own guards only
        for op in (torch.Tensor.relu, torch.Tensor.sigmoid, torch.Tensor.exp,
                   torch.Tensor.relu):
            f = holder(op)
            # no torch._dynamo.reset() between: the frame's code is the same each time
            torch.testing.assert_close(torch.compile(f, backend="torchtpu")(x), f(x))
