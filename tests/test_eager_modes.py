"""The three eager modes (strict, debug, defer-and-fuse) train like CPU; fusing caches whole steps;
torch.compile takes and returns tpu tensors."""
import copy
import os
import subprocess
import sys

import pytest
import torch

import torchtpu_compile
import torchtpu_eager  # noqa: F401
from tests.support.helpers import compile_tpu
from torchtpu_compile import config

TPU = torch.device("tpu", 0)
MODES = ["strict", "debug", "defer_and_fuse"]


@pytest.fixture(autouse=True)
def fp32_matmuls():
    with config.patch(matmul_precision="highest"):
        yield



def tiny_transformer(depth=2, seed=0):
    torch.manual_seed(seed)
    layers = [torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
              for _ in range(depth)]
    return torch.nn.Sequential(*layers, torch.nn.Linear(16, 4))


def train(model, x, y, steps, make_opt=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)):
    opt = make_opt(model.parameters())
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # a materialization point each step
    return losses


@pytest.mark.parametrize("eager_mode", MODES, indirect=True)
def test_transformer_training_matches_cpu(eager_mode):
    ref = tiny_transformer()
    dev = copy.deepcopy(ref).to("tpu")
    torch.manual_seed(1)
    x, y = torch.randn(3, 5, 16), torch.randn(3, 5, 4)
    expected = train(ref, x, y, steps=3)
    got = train(dev, x.to("tpu"), y.to("tpu"), steps=3)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        assert p_dev.device == TPU
        torch.testing.assert_close(p_dev.detach().cpu(), p_ref.detach(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("eager_mode", ["debug"], indirect=True)
def test_debug_mode_waits_for_each_op(eager_mode):
    a = torch.randn(256, 256, device="tpu")
    b = a @ a
    assert b._st.value.is_ready()  # finished when the op returned
    with config.patch(strict=True):
        with pytest.raises(Exception, match="aten.masked_select") as info:
            b.masked_select(b > 0)
    # the error is raised at the op, from this test's frame
    assert any(entry.name == "test_debug_mode_waits_for_each_op"
               for entry in info.traceback)


@pytest.mark.parametrize("eager_mode", ["defer_and_fuse"], indirect=True)
def test_fuse_defers_until_a_materialization_point(eager_mode):
    torchtpu_compile.reset_stats()
    x = torch.randn(32, device="tpu")
    y = (x * 2).relu() + 1
    assert torchtpu_compile.stats()["fused_graphs_run"] == 0  # nothing has run yet
    assert float(y.sum()) > 0  # .item(): runs the recorded graph
    assert torchtpu_compile.stats()["fused_graphs_run"] == 1
    z = y.clone()
    if z.max() > 0:  # a data-dependent branch is a materialization point too
        z = z - 1
    torch.testing.assert_close(z.cpu(), (x.cpu() * 2).relu())
    print(y)  # and printing
    assert torchtpu_compile.stats()["fused_graphs_run"] >= 3


@pytest.mark.parametrize("eager_mode", ["defer_and_fuse"], indirect=True)
def test_fused_training_loop_compiles_once(eager_mode):
    model = tiny_transformer().to("tpu")
    x, y = torch.randn(2, 5, 16).to("tpu"), torch.randn(2, 5, 4).to("tpu")
    train(model, x, y, steps=3)  # step 1 and 2 differ (momentum buffers appear at step 1)
    before = torchtpu_compile.stats()
    train(model, x, y, steps=3)
    after = torchtpu_compile.stats()
    assert after["eager_programs_compiled"] == before["eager_programs_compiled"]
    assert after["fused_graph_cache_hits"] - before["fused_graph_cache_hits"] == \
        after["fused_graphs_run"] - before["fused_graphs_run"] > 0


@pytest.mark.parametrize("variable,mode", [("TORCH_TPU_LAUNCH_BLOCKING", "debug"),
                                           ("TORCH_TPU_DEFER_AND_FUSE", "defer_and_fuse")])
def test_mode_from_environment(variable, mode):
    code = ("import torch\n"
            "x = torch.ones(3, device='tpu') * 2\n"
            "assert x.sum().item() == 6.0\n"
            "print(torch.tpu.get_eager_mode())\n")
    env = dict(os.environ, **{variable: "1"})
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == mode


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown tpu eager mode 'lazy'"):
        torch.tpu.set_eager_mode("lazy")


@pytest.mark.parametrize("eager_mode", ["strict", "defer_and_fuse"], indirect=True)
def test_compile_takes_and_returns_tpu_tensors(eager_mode, fresh_dynamo):
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    dev = copy.deepcopy(ref).to("tpu")
    compiled = compile_tpu(dev)
    x = torch.randn(4, 8)
    out = compiled(x.to("tpu"))
    assert out.device == TPU
    torch.testing.assert_close(out.cpu(), ref(x), atol=1e-5, rtol=1e-5)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt_dev = torch.optim.SGD(dev.parameters(), lr=0.1)
    for model, opt, inp in ((ref, opt_ref, x), (compiled, opt_dev, x.to("tpu"))):
        for _ in range(2):
            opt.zero_grad()
            model(inp).square().mean().backward()
            opt.step()
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        assert p_dev.grad.device == TPU
        torch.testing.assert_close(p_dev.detach().cpu(), p_ref.detach(), atol=1e-5, rtol=1e-5)
    stats = torchtpu_compile.stats()
    assert stats["resident_uploads"] == 0  # nothing went through the host
    assert not stats["fallback_ops"]


def test_graph_breaks_run_on_the_device(fresh_dynamo):
    def fn(x):
        y = x.sin() * 2
        print("a graph break")  # Dynamo splits the graph here; the rest is eager tpu code
        return (y + 1).cos()

    x = torch.randn(6)
    out = compile_tpu(fn)(x.to("tpu"))
    assert out.device == TPU
    torch.testing.assert_close(out.cpu(), fn(x))
