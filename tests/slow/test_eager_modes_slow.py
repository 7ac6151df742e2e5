"""Defer-and-fuse on a deeper model: the repeated-block cuts reuse compiled pieces
(test_eager_modes.py has the fast cases)."""
import copy

import pytest
import torch

import torchtpu_compile
from tests import test_eager_modes as fast
from tests.test_eager_modes import tiny_transformer, train

pytestmark = pytest.mark.slow

#: The fast module's fixtures: its eager modes, and fp32 matmuls for every test (autouse).
eager_mode, fp32_matmuls = fast.eager_mode, fast.fp32_matmuls


@pytest.mark.parametrize("eager_mode", ["defer_and_fuse"], indirect=True)
def test_repeated_blocks_reuse_compiled_pieces(eager_mode):
    x, y = torch.randn(2, 5, 16).to("tpu"), torch.randn(2, 5, 4).to("tpu")
    train(tiny_transformer(depth=4).to("tpu"), x, y, steps=2)
    before = torchtpu_compile.stats()
    deeper = tiny_transformer(depth=6).to("tpu")
    expected = train(copy.deepcopy(deeper).cpu(), x.cpu(), y.cpu(), steps=2)
    got = train(deeper, x, y, steps=2)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    after = torchtpu_compile.stats()
    runs = after["fused_graphs_run"] - before["fused_graphs_run"]
    hits = after["fused_graph_cache_hits"] - before["fused_graph_cache_hits"]
    # The deeper model is cut at its blocks, which the shallower one already compiled.
    assert runs > 4 and hits >= runs // 2, (runs, hits)


def test_forward_mode_jacfwd_of_grad_on_tpu():
    # Forward AD makes a constant's tangent a ZeroTensor: made on the host, it failed to
    # upload ("Cannot convert a ZeroTensor to numpy").
    x = torch.tensor([0.5, -1.0, 2.0])

    def hess(v):
        return torch.func.jacfwd(torch.func.grad(lambda v: v.square().sum()))(v)
    torch.testing.assert_close(hess(x.to("tpu")).cpu(), hess(x))
