"""``torch.autocast("tpu")`` and ``torch.amp.GradScaler("tpu")`` against CPU PyTorch.

Dtypes follow CUDA's autocast policy (torch's autocast_mode.h): matmuls and convolutions in
the autocast dtype, softmax, norms, losses and dtype-taking reductions in float32, several
floating inputs promoted to the widest. Values are checked against the same casts done by hand
on CPU.
"""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import torchtpu_compile
import torchtpu_eager  # noqa: F401  (registers the device; autoload does too)
from torchtpu_compile import config

LOW = [torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def on_device_only():
    # strict: an op that would run on the host is an error, so everything here runs on tpu.
    with config.patch(strict=True, matmul_precision="highest"):
        yield


def _close(tpu_value, cpu_value, dtype):
    assert tpu_value.dtype == cpu_value.dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(tpu_value.cpu(), cpu_value, atol=tol, rtol=tol)


def test_autocast_dtype_of_tpu():
    assert torch.amp.is_autocast_available("tpu")
    assert torch.get_autocast_dtype("tpu") == torch.float16   # CUDA's default
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert torch.get_autocast_dtype("tpu") == torch.bfloat16
        assert torch.is_autocast_enabled("tpu")
    assert not torch.is_autocast_enabled("tpu")


@pytest.mark.parametrize("low", LOW, ids=str)
def test_op_dtypes_and_values_follow_cuda_policy(low):
    torch.manual_seed(0)
    a, b = torch.randn(4, 6), torch.randn(6, 5)
    img, kernel = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    A, B, IMG, KERNEL = (t.to("tpu") for t in (a, b, img, kernel))
    with torch.autocast("tpu", dtype=low):
        mm = A @ B
        linear = F.linear(A, B.t())
        conv = F.conv2d(IMG, KERNEL)
        softmax = torch.softmax(mm, -1)
        norm = F.layer_norm(mm, (5,))
        loss = F.mse_loss(mm, torch.zeros(4, 5, device="tpu"))
        total = mm.sum()
        kept = mm.sum(dtype=low)                      # an explicit dtype is respected
        promoted = torch.addcmul(A[:, :5], mm, mm)    # float32 and low: float32
        plain = mm + 1                                # not listed: runs in its input's dtype
    lo_a, lo_b = a.to(low), b.to(low)
    lo_mm = lo_a @ lo_b
    _close(mm, lo_mm, low)
    _close(linear, F.linear(lo_a, lo_b.t()), low)
    _close(conv, F.conv2d(img.to(low), kernel.to(low)), low)
    _close(softmax, torch.softmax(lo_mm.float(), -1), low)
    _close(norm, F.layer_norm(lo_mm.float(), (5,)), low)
    _close(loss, F.mse_loss(lo_mm.float(), torch.zeros(4, 5)), low)
    _close(total, lo_mm.float().sum(), low)
    _close(kept, lo_mm.sum(dtype=low), low)
    _close(promoted, torch.addcmul(a[:, :5], lo_mm.float(), lo_mm.float()), low)
    _close(plain, lo_mm + 1, low)


def test_gradients_come_back_in_the_parameters_dtype():
    torch.manual_seed(0)
    cpu = torch.nn.Linear(6, 3)
    tpu = torch.nn.Linear(6, 3).to("tpu")
    tpu.load_state_dict(cpu.state_dict())
    x = torch.randn(4, 6)
    for model, device in ((cpu, "cpu"), (tpu, "tpu")):
        # CPU's autocast runs linear in bfloat16 and mse_loss in float32 too.
        with torch.autocast(device, dtype=torch.bfloat16):
            F.mse_loss(model(x.to(device)), torch.ones(4, 3, device=device)).backward()
    assert tpu.weight.grad.dtype == torch.float32
    torch.testing.assert_close(tpu.weight.grad.cpu(), cpu.weight.grad, atol=2e-2, rtol=2e-2)


def test_binary_cross_entropy_is_refused_as_on_cuda():
    p = torch.rand(3, device="tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16), \
            pytest.raises(RuntimeError, match="unsafe to autocast"):
        F.binary_cross_entropy(p, torch.ones(3, device="tpu"))


def test_grad_scaler_matches_cpu_on_device():
    # Scale growth (interval 2), an inf gradient skipping a step and backing off, unscaling:
    # the same scales and parameters as GradScaler("cpu"), with no op run on the host.
    torch.manual_seed(0)
    data = [torch.randn(3, 4) for _ in range(4)]
    results = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(1)
        model = torch.nn.Linear(4, 2).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 8, growth_interval=2)
        scales = []
        for step, x in enumerate(data):
            scaler.scale(model(x.to(device)).square().sum()).backward()
            if step == 2:
                model.weight.grad[0, 0] = float("inf")
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            scales.append(scaler.get_scale())
        results[device] = scales, [p.detach().cpu() for p in model.parameters()]
    assert results["tpu"][0] == results["cpu"][0] == [256.0, 512.0, 256.0, 256.0]
    for got, want in zip(results["tpu"][1], results["cpu"][1]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_grad_scaler_keeps_learning_at_the_largest_scales():
    # Left on in float32 training, the scale grows every interval up to 2**127, whose inverse
    # is subnormal: XLA flushed it to 0, every gradient unscaled to zero with no inf found,
    # and the parameters stopped moving. The scale stops at 2**126 on the device instead.
    params = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 125, growth_interval=1)
        for _ in range(4):
            scaler.scale(model(torch.ones(3, 4, device=device)).square().mean()).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        params[device] = [p.detach().cpu() for p in model.parameters()]
    assert scaler.get_scale() == 2.0 ** 126
    for got, want in zip(params["tpu"], params["cpu"]):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_autocast_inside_a_compiled_graph(fresh_dynamo):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4)).to("tpu")
    x, target = torch.randn(5, 8, device="tpu"), torch.randint(0, 4, (5,), device="tpu")

    def step(x, target):
        with torch.autocast("tpu", dtype=torch.bfloat16):
            out = model(x)
            return out, F.cross_entropy(out, target)

    out, loss = torch.compile(step, backend="torchtpu")(x, target)
    eager_out, eager_loss = step(x, target)
    assert (out.dtype, loss.dtype) == (torch.bfloat16, torch.float32)
    _close(out, eager_out.cpu(), torch.bfloat16)
    _close(loss, eager_loss.cpu(), torch.bfloat16)
    assert torchtpu_compile.stats()["fallback_ops"] == {}


@pytest.mark.parametrize("where", ["outside", "inside"])
@pytest.mark.parametrize("device", ["tpu", "cpu"])
def test_a_compiled_float32_op_of_half_inputs_under_autocast_returns_float32(
        device, where, fresh_dynamo):
    # multi_margin_loss is on autocast's float32 list: its CPU kernel, which refuses
    # bfloat16, never sees one. The compile path's dtype probe ran it on bfloat16 regardless,
    # and every call raised "multi_margin_loss_cpu_kernel" not implemented for 'BFloat16'.
    x = torch.randn(3, 4).to(device, torch.bfloat16)
    target = torch.tensor([0, 2, 1], device=device)

    def loss(x, target):
        if where == "inside":
            with torch.autocast(device, dtype=torch.bfloat16):
                return F.multi_margin_loss(x, target)
        return F.multi_margin_loss(x, target)

    compiled = torch.compile(loss, backend="torchtpu")
    with torch.autocast(device, dtype=torch.bfloat16, enabled=where == "outside"):
        actual, expected = compiled(x, target), loss(x, target)
    assert actual.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(actual.cpu(), expected.cpu())


def test_a_compiled_op_refusing_half_inputs_outside_autocast_still_raises(fresh_dynamo):
    # autocast off in a region: eager's CPU kernel refuses the dtype, and so does the graph
    x = torch.randn(3, 4, dtype=torch.bfloat16)
    target = torch.tensor([0, 2, 1])

    def loss(x, target):
        with torch.autocast("cpu", enabled=False):
            return F.multi_margin_loss(x, target)

    with pytest.raises(NotImplementedError, match="not implemented for 'BFloat16'"):
        loss(x, target)
    with torch.autocast("cpu", dtype=torch.bfloat16), \
            pytest.raises(NotImplementedError, match="not implemented for 'BFloat16'"):
        torch.compile(loss, backend="torchtpu")(x, target)


class _CountCasts(TorchDispatchMode):
    """Counts the dtype casts that reach the backends (cached casts never do)."""

    def __init__(self):
        super().__init__()
        self.casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            self.casts += 1
        return func(*args, **(kwargs or {}))


def _cast_cache_scenarios(device):
    """Cast counts and results of uses of one weight that CUDA's cast cache tells apart."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 8).to(device))
    x = torch.randn(8, 8).to(device)
    frozen = torch.randn(8, 8).to(device)                    # a leaf that needs no grad
    counts, outs = {}, []

    def run(name, body, **autocast):
        with _CountCasts() as count:
            with torch.autocast(device, dtype=torch.bfloat16, **autocast):
                outs.append(body())
        counts[name] = count.casts

    run("reused", lambda: torch.mm(torch.mm(x, w), w))      # w cast once
    run("next region", lambda: torch.mm(x, w))               # the cache was cleared on exit

    def nested():
        with torch.autocast(device, dtype=torch.bfloat16):
            y = torch.mm(x, w)
        return torch.mm(y, w)                                 # the inner exit kept the cache
    run("nested", nested)
    run("cache off", lambda: torch.mm(torch.mm(x, w), w), cache_enabled=False)
    run("not leaves", lambda: torch.mm(torch.mm(x, w * 1), w * 1))
    run("views", lambda: torch.mm(torch.mm(x, w[:]), w[:]))
    run("no grad", lambda: torch.mm(torch.mm(x, frozen), frozen))

    def inference():
        with torch.inference_mode():
            return torch.mm(torch.mm(x, w), w)
    run("inference mode", inference)
    (outs[0].float().sum() + outs[2].float().sum()).backward()
    with torch.no_grad():                                     # between regions: seen after
        w.mul_(2)
    run("after a write", lambda: torch.mm(x, w))
    return counts, [o.cpu() for o in outs], w.grad.cpu()


def test_weights_are_cast_once_per_autocast_region_as_cuda_does():
    # CUDA's (and CPU's) cached_cast: a float32 leaf requiring grad is cast once per region;
    # before the cache, tpu cast it at every op (the "reused" region: 3 casts, CPU 2), and the
    # gradient of a reused weight, summed in float32 instead of bfloat16, differed from CPU's.
    cpu_counts, cpu_outs, cpu_grad = _cast_cache_scenarios("cpu")
    tpu_counts, tpu_outs, tpu_grad = _cast_cache_scenarios("tpu")
    assert tpu_counts == cpu_counts
    assert cpu_counts["reused"] == 2 and cpu_counts["cache off"] == 3   # the reference's rules
    for got, want in zip(tpu_outs, cpu_outs):
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(tpu_grad, cpu_grad, atol=1e-6, rtol=1e-6)


def test_torch_clear_autocast_cache_clears_the_tpu_casts():
    from torchtpu_eager import autocast
    w = torch.nn.Parameter(torch.randn(4, 4, device="tpu"))
    with torch.autocast("tpu", dtype=torch.bfloat16):
        torch.mm(w, w)
        assert len(autocast._cast_cache) == 1
        torch.clear_autocast_cache()
        assert not autocast._cast_cache
    assert not autocast._cast_cache


def test_the_legacy_torch_tpu_amp_names_work_as_torch_cuda_amps_do():
    # torch.cuda.amp.autocast()/GradScaler() with the device string changed raised
    # AttributeError: torch.tpu had no amp. They are torch.amp's, float16 by default, with
    # CUDA's FutureWarning naming the torch.amp spelling.
    from torch.tpu.amp import GradScaler, autocast
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    model = torch.nn.Linear(4, 3).to("tpu")
    model.load_state_dict(linear.state_dict())
    with pytest.warns(FutureWarning, match=r"torch.amp.autocast\('tpu'"):
        with autocast():
            legacy = model(x.to("tpu"))
    with torch.autocast("tpu"):
        current = model(x.to("tpu"))
    assert legacy.dtype == torch.float16
    assert torch.equal(legacy.cpu(), current.cpu())
    with pytest.warns(FutureWarning):
        with torch.tpu.amp.autocast(dtype=torch.bfloat16):
            _close(model(x.to("tpu")), F.linear(x.bfloat16(), linear.weight.bfloat16(),
                                                linear.bias.bfloat16()), torch.bfloat16)
    with pytest.warns(FutureWarning, match="GradScaler"):
        scaler = GradScaler(init_scale=8.0)
    scaler.scale(model(x.to("tpu")).sum()).backward()
    assert scaler.get_scale() == 8.0 and model.weight.grad.device.type == "tpu"
