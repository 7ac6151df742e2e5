"""Autograd features of user code on the tpu device and in compiled graphs, against eager CPU.

Each test is a case from tutorial-style code (docs/reliability.md, the real-code table) that
gave other values than eager CPU before its fix.
"""
import pytest
import torch
import torch.nn.functional as F

import torchtpu_eager  # noqa: F401


def test_linearize_on_tpu_tensors_gives_cpus_jvp():
    # torch.func.linearize traces jvp with make_fx; make_fx recorded the device's dispatch code
    # instead of the ops and returned the tracing tangents' values (all zeros here).
    torch.manual_seed(0)
    x, t = torch.randn(3, 4), torch.randn(3, 4)
    for f in (torch.sin, F.silu, lambda x: (x * x).cumsum(-1)):
        want = torch.func.linearize(f, x)[1](t)
        got = torch.func.linearize(f, x.to("tpu"))[1](t.to("tpu"))
        assert got.device.type == "tpu"
        torch.testing.assert_close(got.cpu(), want)


def test_make_fx_records_ops_on_tpu_tensors():
    from torch.fx.experimental.proxy_tensor import make_fx
    w = torch.randn(3).to("tpu")
    gm = make_fx(lambda t: (t * w).sin())(torch.randn(3).to("tpu"))
    ops = [node.target for node in gm.graph.nodes if node.op == "call_function"]
    assert ops == [torch.ops.aten.mul.Tensor, torch.ops.aten.sin.default]
    t = torch.randn(3)
    torch.testing.assert_close(gm(t.to("tpu")).cpu(), (t * w.cpu()).sin())


def _dual_call(f, x, t):
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        out = fwAD.unpack_dual(f(fwAD.make_dual(x, t)))
    return out.primal, out.tangent


def test_dual_tensors_into_a_compiled_function_keep_their_tangents(fresh_dynamo):
    # The XLA program computed the primal only: unpack_dual gave a None tangent.
    import torchtpu_compile
    torch.manual_seed(0)
    x, t = torch.randn(4, 3), torch.randn(4, 3)

    def f(x):
        return (x.sin() * x.cos().exp()).sum(-1)
    want = _dual_call(f, x, t)
    for device in ("cpu", "tpu"):
        torch._dynamo.reset()
        primal, tangent = _dual_call(torch.compile(f, backend="torchtpu"), x.to(device),
                                     t.to(device))
        assert tangent is not None and tangent.device.type == device
        torch.testing.assert_close((primal.cpu(), tangent.cpu()), want)
    assert torchtpu_compile.stats()["fallback_ops"]["forward_ad"] == 2


def test_dual_tensors_into_a_compiled_function_under_strict_raise(fresh_dynamo):
    import pytest

    from torchtpu_compile import config
    from torchtpu_compile.errors import UnsupportedOpError
    f = torch.compile(lambda x: x.sin(), backend="torchtpu")
    with config.patch(strict=True):
        f(torch.randn(3))  # no tangents: XLA, no error
        with pytest.raises(UnsupportedOpError, match="forward-mode AD"):
            _dual_call(f, torch.randn(3), torch.randn(3))


def test_a_view_of_an_inference_tensor_is_one_outside_inference_mode():
    # The view was made as a normal tensor: a write through it went through where the CPU
    # raises "Inplace update to inference tensor outside InferenceMode".
    import pytest

    def views(y):
        return [y[0], y.t(), y.view(12), *y.split(2)]

    for device in ("cpu", "tpu"):
        with torch.inference_mode():
            y = torch.randn(4, 3).to(device)
        assert all(v.is_inference() for v in views(y)), device
        with pytest.raises(RuntimeError, match="Inplace update to inference tensor"):
            y[0].mul_(2)


def test_a_cpu_gradient_of_a_tpu_tensor_raises_cudas_error():
    # PyTorch's engine checks gradients' devices for plain tensors only: a CPU gradient was
    # taken and x.grad left on the CPU, until the optimizer's step failed far away.
    x = torch.randn(3).to("tpu").requires_grad_()
    with pytest.raises(RuntimeError, match="invalid gradient at index 0 - expected device "
                                           "tpu:0 but got cpu"):
        (x * 2).backward(torch.ones(3))
    assert x.grad is None
    (x * 2).backward(torch.ones(3, device="tpu"))
    loss = (x * 2).sum()
    loss.backward(torch.tensor(2.0))  # a 0-d one is moved, as on CUDA
    assert x.grad.device == x.device
    torch.testing.assert_close(x.grad.cpu(), torch.full((3,), 6.0))


def test_torch_func_grad_through_attention_on_tpu_tensors_gives_cpus():
    # The attention kernel's layout probe made host tensors with requires_grad_(), which
    # torch.func's transforms refuse: grad/vjp/jacrev of anything with SDPA raised (per-sample
    # gradients of a transformer), unless the shape had been seen outside a transform.
    from torch.func import grad
    from torchtpu_eager.kernels import _cpu_attention_order
    _cpu_attention_order.cache_clear()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8, generator=g) for _ in range(3))

    def loss(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum()

    from torchtpu_compile import config
    with config.patch(matmul_precision="highest"):
        got = grad(loss, argnums=(0, 1, 2))(q.to("tpu"), k.to("tpu"), v.to("tpu"))
    for g_tpu, g_cpu in zip(got, grad(loss, argnums=(0, 1, 2))(q, k, v)):
        torch.testing.assert_close(g_tpu.cpu(), g_cpu, rtol=1e-4, atol=1e-5)
