"""The eager "tpu" device against eager CPU PyTorch: device API, tensors, views, autograd, RNG."""
import contextlib
import io
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

import torchtpu_compile
import torchtpu_eager  # noqa: F401  (registers the device; autoload does too)
from torchtpu_compile import config
from tests.support.helpers import train_side_by_side

TPU = torch.device("tpu", 0)


@pytest.fixture(autouse=True)
def fp32_matmuls():
    """Compare fp32 results with CPU: no bf16 emulation of TPU's default matmul precision."""
    with config.patch(matmul_precision="highest"):
        yield


def test_device_is_registered_and_named_tpu():
    x = torch.zeros(2, device="tpu")
    assert x.device == TPU and x.device.index == 0
    assert x.is_tpu and torch.ones(1).tpu().is_tpu
    assert torch.device("tpu").type == "tpu"
    assert "device='tpu:0'" in repr(torch.arange(3.0, device="tpu"))
    assert repr(torch.ones(2, device="tpu")) == "tensor([1., 1.], device='tpu:0')"
    assert f"{torch.tensor(2.5, device='tpu'):.1f}" == "2.5"


@pytest.mark.parametrize("make", [
    lambda: torch.ones(2, device="tpu:1"),
    lambda: torch.empty(2, device=torch.device("tpu", 3)),
    lambda: torch.arange(3, device="tpu:1"),
    lambda: torch.tensor([1.0], device="tpu:1"),
    lambda: torch.ones(2).to("tpu:1"),
    lambda: torch.ones(2, device="tpu").to("tpu:2"),
    lambda: torch.ones(2, device="tpu").new_zeros(3, device="tpu:1"),
    lambda: torch.nn.Linear(2, 2).to("tpu:1"),
], ids=["ones", "empty", "arange", "tensor", "to", "tpu_to", "new_zeros", "module_to"])
def test_a_tpu_device_that_does_not_exist_is_refused(make):
    # With one device (tpu:0), tensors made for tpu:1 landed on tpu:0, where CUDA raises
    # "invalid device ordinal" for a device index past its count.
    with pytest.raises(RuntimeError, match=r"tpu:\d does not exist"):
        make()
    assert torch.ones(2, device="tpu:0").device == torch.ones(2, device="tpu").device


def test_torch_tpu_module():
    assert torch.tpu.is_available() and torch.tpu.device_count() == 1
    assert torch.tpu.current_device() == 0
    torch.tpu.set_device(0)
    with pytest.raises(RuntimeError, match="tpu:1 does not exist"):
        torch.tpu.set_device(1)
    assert torch.tpu.get_device_name().startswith("cpu")
    assert torch.tpu.get_device_properties().total_memory > 0
    torch.tpu.synchronize()


def test_torch_tpu_has_what_cuda_scripts_call():
    # Each raised AttributeError: a CUDA script calling it stopped there.
    torch.tpu.init()
    torch.tpu._lazy_init()
    assert torch.tpu.is_initialized()
    torch.tpu.ipc_collect()
    assert torch.tpu.get_device_capability() == torch.tpu.get_device_capability(0) == (0, 0)
    props = torch.tpu.get_device_properties(0)
    assert (props.major, props.minor) == (0, 0)
    x = torch.ones(4, device="tpu")
    torch.tpu.synchronize()
    assert torch.tpu.utilization() == 0  # idle: nothing issued is still running
    assert torch.tpu.memory_cached() == torch.tpu.memory_reserved()
    assert torch.tpu.max_memory_cached() == torch.tpu.max_memory_reserved()
    torch.tpu.reset_max_memory_cached()
    with torch.tpu.device_of(x), torch.tpu.device_of(torch.ones(1)):
        pass
    assert torch.tpu.OutOfMemoryError is torch.cuda.OutOfMemoryError
    with pytest.raises(RuntimeError, match="tpu:1 does not exist"):
        torch.tpu.get_device_capability(1)
    del x


@pytest.mark.parametrize("name", ["FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor",
                                  "LongTensor", "IntTensor", "ShortTensor", "CharTensor",
                                  "ByteTensor", "BoolTensor"])
def test_legacy_typed_constructors_make_tpu_tensors(name):
    # torch.tpu.FloatTensor(...) raised AttributeError; torch.cuda.FloatTensor makes a CUDA
    # tensor as torch.FloatTensor makes a host one.
    cls, host_cls = getattr(torch.tpu, name), getattr(torch, name)
    want = host_cls([1, 0, 3])
    got = cls([1, 0, 3])
    assert got.device.type == "tpu" and torch.equal(got.cpu(), want)
    empty = cls(2, 3)
    assert empty.shape == (2, 3) and empty.dtype == want.dtype and empty.device.type == "tpu"
    assert cls(torch.Size([4])).shape == (4,) and cls().shape == (0,)
    assert isinstance(got, cls) and not isinstance(want, cls)
    assert cls(got) is got  # the same tensor, as on CUDA
    with pytest.raises(TypeError, match="expected"):
        cls(want)  # a host tensor: CUDA's classes refuse one too
    assert got.type() == f"torch.tpu.{name}"
    assert torch.equal(want.type(cls).cpu(), want) and want.type(cls).device.type == "tpu"


def test_memory_stats_follow_live_tensors():
    # fill_ keeps its value uploaded (a 0-d buffer per value, scalars.as_input): made here
    # first, so that what is counted below is the tensor alone, whichever test ran before.
    torch.ones(1, device="tpu")
    torch.tpu.reset_peak_memory_stats()
    before = torch.tpu.memory_allocated()
    x = torch.ones(1024, 256, device="tpu")
    assert torch.tpu.memory_allocated() - before == 1024 * 256 * 4
    assert torch.tpu.max_memory_allocated() >= before + 1024 * 256 * 4
    del x
    assert torch.tpu.memory_allocated() == before


@pytest.mark.parametrize("make", [
    lambda d: torch.zeros(2, 3, device=d),
    lambda d: torch.ones(4, dtype=torch.int32, device=d),
    lambda d: torch.full((2, 2), 7.5, device=d),
    lambda d: torch.arange(1, 10, 2, device=d),
    lambda d: torch.linspace(0, 1, 5, device=d),
    lambda d: torch.eye(3, device=d),
    lambda d: torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=d),
    lambda d: torch.empty(3, device=d).fill_(2.0),
    # its kernel has CPU and CUDA entries only: an internal assert on tpu
    lambda d: torch.kaiser_window(8, device=d),
    lambda d: torch.kaiser_window(8, periodic=False, beta=5.0, device=d),
    lambda d: torch.signal.windows.kaiser(8, device=d),
], ids=["zeros", "ones", "full", "arange", "linspace", "eye", "tensor", "empty", "kaiser",
        "kaiser_beta", "signal_kaiser"])
def test_factories_match_cpu(make):
    out = make("tpu")
    assert out.device == TPU
    torch.testing.assert_close(out.cpu(), make("cpu"))


def test_moving_data_out():
    x = torch.arange(6.0).reshape(2, 3).to("tpu")
    assert x.cpu().device.type == "cpu"
    assert x.to("cpu", torch.float64).dtype == torch.float64
    assert x.sum().item() == 15.0
    assert x.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    with pytest.raises(TypeError, match="can't convert tpu:0 device type tensor to numpy"):
        x.numpy()


def test_host_copies_do_not_alias_device_data():
    host = torch.ones(4)
    dev = host.to("tpu")
    host.add_(1)  # must not reach the device copy
    back = dev.cpu()
    back.add_(10)  # nor must a write to what came back
    torch.testing.assert_close(dev.cpu(), torch.ones(4))


def test_copy_across_devices():
    dev = torch.zeros(2, 3, device="tpu")
    dev.copy_(torch.arange(6.0).reshape(2, 3))
    host = torch.empty(2, 3)
    host.copy_(dev)
    torch.testing.assert_close(host, torch.arange(6.0).reshape(2, 3))
    dev.copy_(torch.tensor(1.0))  # broadcast from a 0-dim host tensor
    torch.testing.assert_close(dev.cpu(), torch.ones(2, 3))


def test_writes_through_views_reach_base_and_other_views():
    base_cpu = torch.arange(16.0).reshape(4, 4)
    base = base_cpu.to("tpu")
    for b in (base_cpu, base):
        b.view(16)[3:5].add_(100)
        b.t()[0].mul_(-1)
        b[2:, 1:3] = 7.0
        b.diagonal().zero_()
    torch.testing.assert_close(base.cpu(), base_cpu)
    row = base[1]
    base.add_(1)  # a write to the base reaches an earlier view
    torch.testing.assert_close(row.cpu(), base_cpu[1] + 1)


@pytest.mark.parametrize("make_view", [
    lambda b: b.t(), lambda b: b.permute(2, 0, 1), lambda b: b.transpose(0, 2),
    lambda b: b.unsqueeze(1).transpose(0, 3), lambda b: b.t().expand(2, -1, -1),
    lambda b: b[1:].transpose(0, 1), lambda b: b[:, ::2], lambda b: b.as_strided((3, 3), (1, 3)),
    lambda b: b.view(-1)[2:14].view(3, 4).t(),
], ids=["t", "permute", "transpose", "unsqueezed", "expanded", "sliced", "stepped",
        "as_strided", "offset"])
def test_reads_and_writes_through_strided_views(make_view):
    # Transposed, permuted and broadcast views of a whole base are read and written with a
    # transpose, others with a gather and a scatter: the same values either way.
    torch.manual_seed(0)
    for shape in ((4, 6), (2, 3, 4)):
        base_cpu = torch.randn(shape)
        try:
            view_cpu = make_view(base_cpu)
        except (RuntimeError, IndexError):
            continue  # not a view of this rank
        base = base_cpu.to("tpu")
        view = make_view(base)
        assert view.stride() == view_cpu.stride()
        torch.testing.assert_close((view * 2).cpu(), view_cpu * 2)
        torch.testing.assert_close(view.cpu(), view_cpu)
        if 0 in view_cpu.stride():
            continue  # eager refuses in-place writes to broadcast views
        new = torch.randn(view_cpu.shape)
        view_cpu.copy_(new)
        view.copy_(new.to("tpu"))
        torch.testing.assert_close(base.cpu(), base_cpu)
        view_cpu.mul_(3)
        view.mul_(3)
        torch.testing.assert_close(base.cpu(), base_cpu)


def test_linear_weight_is_transposed_not_gathered():
    # F.linear reads w.t(): a gather of its elements cost more than the matmul.
    from torchtpu_eager import views
    graph = views._read_graph((8, 16), torch.float32, (16, 8), (1, 16), 0)
    targets = {str(n.target) for n in graph.gm.graph.nodes if n.op == "call_function"}
    assert not any("index" in t or "gather" in t for t in targets), targets
    x, w, b = torch.randn(3, 16), torch.randn(8, 16), torch.randn(8)
    torch.testing.assert_close(F.linear(x.to("tpu"), w.to("tpu"), b.to("tpu")).cpu(),
                               F.linear(x, w, b))


def test_in_place_and_out_ops():
    a_cpu, b_cpu = torch.randn(3, 4), torch.randn(3, 4)
    a, b = a_cpu.to("tpu"), b_cpu.to("tpu")
    assert a.add_(b, alpha=2) is a
    a_cpu.add_(b_cpu, alpha=2)
    out = torch.empty(3, 4, device="tpu")
    result = torch.mul(a, b, out=out)
    assert result is out
    torch.testing.assert_close(out.cpu(), a_cpu * b_cpu)
    values, indices = torch.empty(3, device="tpu"), torch.empty(3, dtype=torch.long, device="tpu")
    torch.max(a, dim=1, out=(values, indices))
    torch.testing.assert_close(values.cpu(), a_cpu.max(dim=1).values)
    torch.testing.assert_close(indices.cpu(), a_cpu.max(dim=1).indices)


@pytest.mark.parametrize("conv", [
    lambda x, w: F.conv2d(x, w), lambda x, w: F.conv_transpose2d(x, w.transpose(0, 1)),
    lambda x, w: F.conv1d(x[0], w[..., 0])])
@pytest.mark.parametrize("weight_on", ["cpu", "tpu"])
def test_a_convolution_of_two_devices_raises_like_cuda(conv, weight_on):
    # A module left on the host given tpu inputs (an ExportedProgram's module() not moved):
    # convolution's device-generic kernel reached convolution_overrideable and raised
    # NotImplementedError ("... not implemented ... TORCH_LIBRARY_IMPL"); CUDA raises a
    # RuntimeError about the devices.
    x, w = torch.randn(1, 3, 5, 5), torch.randn(4, 3, 3, 3)
    x, w = (x.to("tpu"), w) if weight_on == "cpu" else (x, w.to("tpu"))
    with pytest.raises(RuntimeError, match="same device"):
        conv(x, w)


def test_mixing_devices_raises_like_cuda():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(2, device="tpu") + torch.ones(2)
    # 0-dim host tensors are scalars, allowed as on CUDA
    torch.testing.assert_close((torch.ones(2, device="tpu") * torch.tensor(3.0)).cpu(),
                               torch.full((2,), 3.0))


def test_masked_assignment_of_many_values_stays_on_the_device():
    # x[mask] = values with a value per selected row (the DQN tutorial's
    # next_state_values[non_final_mask] = ...) ran on the host, x and values both ways.
    def assign(device):
        x = torch.arange(15.0).reshape(5, 3).to(device)
        mask = torch.tensor([True, False, True, True, False]).to(device)
        rows, row = torch.arange(9.0).reshape(3, 3).to(device), torch.tensor([1.0, 2, 3])
        a, b, c = x.clone(), x.clone(), x.clone()
        a[mask] = rows
        b[mask] = row.to(device)
        c.index_put_((mask,), rows, accumulate=True)
        flat = torch.zeros(4).to(device)
        flat[torch.tensor([True, False, True, False]).to(device)] = torch.tensor([3.0, 4]).to(
            device)
        with pytest.raises(RuntimeError) as raised:
            x.clone()[mask] = torch.ones(2, 3).to(device)
        column = torch.zeros(5, 1).to(device)  # a row of 3 does not fit a column: eager raises
        with pytest.raises(RuntimeError, match="shape mismatch"):
            column[mask] = row.to(device)
        return [t.cpu() for t in (a, b, c, flat, column)], str(raised.value)
    expected = assign("cpu")
    before = dict(torchtpu_compile.stats()["fallback_ops"])
    with config.patch(strict=True):
        actual = assign("tpu")
    torch.testing.assert_close(actual[0], expected[0], rtol=0, atol=0)
    assert actual[1] == expected[1]  # eager's "shape mismatch" message
    assert torchtpu_compile.stats()["fallback_ops"] == before


@pytest.mark.parametrize("make_mask", [
    lambda m: m.view(1, 3, 3).expand(2, 3, 3), lambda m: m.view(3, 3).t().expand(2, 3, 3),
], ids=["expanded", "transposed"])
def test_masked_assignment_of_many_values_through_a_strided_mask(make_mask):
    # torchvision's fill of rotated images: y[m.expand_as(y)] = fill[m.expand_as(y)]. The
    # mask was flattened with view, which an expanded or transposed mask refuses
    def assign(device):
        y = torch.arange(18.0).reshape(2, 3, 3).to(device)
        mask = make_mask(torch.arange(9).to(device) % 2 == 0)
        y[mask] = torch.arange(float(mask.sum().item())).to(device) * -1
        return y.cpu()
    expected = assign("cpu")
    with config.patch(strict=True):
        assert torch.equal(assign("tpu"), expected)


@pytest.mark.parametrize("strict", [False, True])
def test_inputs_eager_rejects_raise_its_error_and_nothing_else(strict, caplog):
    # A shape error printed fake tensor's 20-line ERROR traceback and a "runs on the host"
    # warning, counted as a fallback, before eager's error; under TORCHTPU_STRICT=1 it was an
    # UnsupportedOpError saying the op "cannot run on the tpu device".
    a, b = torch.ones(2, 3, device="tpu"), torch.ones(4, 5, device="tpu")
    before = dict(torchtpu_compile.stats()["fallback_ops"])
    with config.patch(strict=strict), caplog.at_level("WARNING"):
        with pytest.raises(RuntimeError) as raised:
            a @ b
        assert type(raised.value) is RuntimeError
        assert str(raised.value) == "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"
        with pytest.raises(RuntimeError, match=r"^mean\(\): could not infer output dtype"):
            torch.arange(3, device="tpu").mean()
    assert [r.getMessage() for r in caplog.records] == []
    assert torchtpu_compile.stats()["fallback_ops"] == before
    torch.testing.assert_close((a @ a.T).cpu(), torch.full((2, 2), 3.0))  # still runs


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_ctc_loss_with_lengths_on_the_host(reduction):
    # CUDA scripts keep CTC's lengths on the host (cuDNN wants them there). On tpu tensors
    # PyTorch's ctc_loss divided the device loss by the host target_lengths: "Expected all
    # tensors to be on the same device".
    torch.manual_seed(0)
    log_probs = torch.randn(12, 2, 6).log_softmax(2)
    targets = torch.tensor([[1, 2, 2, 3], [4, 1, 0, 0]])
    lengths = (torch.tensor([12, 10]), torch.tensor([4, 2]))

    def loss_and_grad(x, targets):
        x = x.detach().requires_grad_()
        loss = F.ctc_loss(x, targets, *lengths, reduction=reduction)
        loss.backward()
        return loss.detach().cpu(), x.grad.cpu()
    torch.testing.assert_close(loss_and_grad(log_probs.to("tpu"), targets.to("tpu")),
                               loss_and_grad(log_probs, targets), rtol=1e-5, atol=1e-6)

def test_autograd_grads_land_on_tpu():
    w_cpu = torch.randn(4, 3, requires_grad=True)
    w = w_cpu.detach().to("tpu").requires_grad_()
    x = torch.randn(2, 4)
    for weight, inp in ((w_cpu, x), (w, x.to("tpu"))):
        (inp @ weight).tanh().sum().backward()
    assert w.grad.device == TPU
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad)


def test_zero_tangents_of_forward_mode_ad_on_tpu():
    # Forward AD makes a constant's tangent a ZeroTensor (jacfwd over grad, torch.func.hessian,
    # a dual through layer_norm): on the tpu device it was made on the host and failed to
    # upload ("Cannot convert a ZeroTensor to numpy"). jacfwd itself:
    # tests/slow/test_eager_modes_slow.py
    zero = torch._efficientzerotensor((2, 3), device="tpu")
    assert zero.device == TPU and torch.equal(zero.cpu(), torch.zeros(2, 3))


def test_forward_ad_through_an_op_with_a_constant_on_tpu():
    # A constant's zero tangent meets the other operand in PyTorch's ZeroTensor kernels, which
    # take the result's geometry from `.to("meta")` copies: a tpu tensor came back from ours,
    # and jvp of `v * 3` (so jacfwd of anything scaled) raised "Tensor on device tpu:0 is not
    # on the expected device meta!".
    from torch.func import jacfwd, jvp
    v, t = torch.randn(3), torch.randn(3)
    want = jvp(lambda v: v * 3 + 1, (v,), (t,))
    got = jvp(lambda v: v * 3 + 1, (v.to("tpu"),), (t.to("tpu"),))
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w)
    torch.testing.assert_close(jacfwd(lambda v: (v * 3).exp())(v.to("tpu")).cpu(),
                               jacfwd(lambda v: (v * 3).exp())(v))
    m = v.to("tpu").t().to("meta", torch.float64)
    assert m.device.type == "meta" and m.shape == (3,) and m.dtype == torch.float64


@pytest.mark.parametrize("optimizer", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    # Adam divides by sqrt(v): a large eps keeps rounding noise of near-zero gradients from
    # turning into full-size updates, on either device.
    lambda p: torch.optim.Adam(p, lr=0.01, eps=1e-3),
    lambda p: torch.optim.AdamW(p, lr=0.01, eps=1e-3, weight_decay=0.1),
], ids=["sgd", "adam", "adamw"])
def test_optimizers_match_cpu(optimizer):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    dev = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    dev.load_state_dict(ref.state_dict())
    dev.to("tpu")
    opt_ref, opt_dev = optimizer(ref.parameters()), optimizer(dev.parameters())
    x, y = torch.randn(5, 6), torch.randn(5, 2)
    train_side_by_side([(ref, opt_ref), (dev, opt_dev)], x, y, steps=3)
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        assert p_dev.device == TPU
        torch.testing.assert_close(p_dev.detach().cpu(), p_ref.detach(), atol=1e-5, rtol=1e-4)


def test_rng_is_reproducible_and_independent_of_cpu():
    torch.tpu.manual_seed(123)
    a = torch.rand(5, device="tpu")
    cpu_before = torch.random.get_rng_state()
    b = torch.randn(5, device="tpu")
    assert torch.equal(torch.random.get_rng_state(), cpu_before)  # CPU generator untouched
    torch.tpu.manual_seed(123)
    torch.testing.assert_close(torch.rand(5, device="tpu").cpu(), a.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(torch.randn(5, device="tpu").cpu(), b.cpu(), rtol=0, atol=0)
    assert torch.tpu.initial_seed() == 123
    ints = torch.randint(0, 5, (100,), device="tpu").cpu()
    assert ints.min() >= 0 and ints.max() < 5 and len(ints.unique()) > 1


def test_dropout_follows_tpu_seed():
    x = torch.ones(1000, device="tpu")
    torch.tpu.manual_seed(7)
    first = torch.nn.functional.dropout(x, 0.5).cpu()
    torch.tpu.manual_seed(7)
    second = torch.nn.functional.dropout(x, 0.5).cpu()
    torch.testing.assert_close(first, second)
    assert set(first.unique().tolist()) == {0.0, 2.0}


def test_dropout_draws_cpus_masks_under_the_same_seed():
    # Host draws (the CPU client's default) gave a mask from torch.rand(...) < 1 - p, where CPU
    # draws bernoulli_: an LSTM with dropout between its layers, seeded alike, trained to
    # other numbers than on the CPU. torch.native_dropout with p == 1 divided by zero.
    x = torch.randn(4, 37)
    with config.patch(random_draws="host"):
        for p in (0.1, 0.5, 0.9):
            torch.manual_seed(5)
            expected = torch.nn.functional.dropout(x, p)
            torch.manual_seed(5)
            got = torch.nn.functional.dropout(x.to("tpu"), p).cpu()
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)
        torch.manual_seed(5)
        lstm = torch.nn.LSTM(3, 4, num_layers=2, dropout=0.5)
        inputs = torch.randn(5, 2, 3)
        torch.manual_seed(6)
        expected = lstm(inputs)[0]
        lstm.to("tpu")
        torch.manual_seed(6)
        torch.testing.assert_close(lstm(inputs.to("tpu"))[0].cpu(), expected)
        out, mask = torch.native_dropout(x.to("tpu"), 1.0, True)
        expected_out, expected_mask = torch.native_dropout(x, 1.0, True)
        assert torch.equal(out.cpu(), expected_out) and torch.equal(mask.cpu(), expected_mask)


def test_save_and_load_with_map_location():
    state = {"w": torch.arange(4.0).to("tpu"), "i": torch.ones(2, dtype=torch.long).to("tpu")}
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    on_tpu = torch.load(buf)
    assert on_tpu["w"].device == TPU
    torch.testing.assert_close(on_tpu["w"].cpu(), torch.arange(4.0))
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    assert on_cpu["w"].device.type == "cpu" and on_cpu["i"].dtype == torch.long
    torch.testing.assert_close(on_cpu["w"], torch.arange(4.0))


def test_save_and_load_keep_tensor_and_parameter_attributes():
    # A round trip dropped them (eager keeps both: a flag a library set on a weight).
    outcomes = {}
    for device in ("cpu", "tpu"):
        t = torch.arange(3.0, device=device)
        t.note = "kept"
        p = torch.nn.Parameter(torch.ones(2, device=device))
        p.shard = 7
        buf = io.BytesIO()
        torch.save({"t": t, "p": p}, buf)
        for where in (None, "cpu"):
            buf.seek(0)
            loaded = torch.load(buf, map_location=where)   # weights_only, torch's default
            outcomes.setdefault(device, []).append(
                (loaded["t"].note, loaded["p"].shard, isinstance(loaded["p"], torch.nn.Parameter),
                 loaded["t"].cpu().tolist()))
    assert outcomes["tpu"] == outcomes["cpu"]


def test_module_to_tpu_and_back():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(64, 2))
    x = torch.randn(2, 3, 6, 6)
    expected = model(x)
    ref_stats = model[1].running_mean.clone()
    model.to("tpu")
    assert all(p.device == TPU for p in model.parameters())
    out = model(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-4)
    # The second forward (on tpu) updates the statistics once more, from the same batch.
    expected_stats = 0.9 * ref_stats + 0.1 * model.cpu()[0](x).mean((0, 2, 3))
    torch.testing.assert_close(model[1].running_mean, expected_stats, atol=1e-5, rtol=1e-4)


def test_batch_norm_training_runs_on_the_device_and_updates_running_stats():
    # native_batch_norm's schema hides its writes to the running statistics: traced as it
    # stood, the device computed the output and silently left the statistics unchanged.
    torch.manual_seed(0)
    ref = torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    dev = torch.nn.BatchNorm2d(3)
    dev.load_state_dict(ref.state_dict())
    dev.to("tpu")
    torchtpu_compile.reset_stats()
    with config.patch(strict=True):
        for _ in range(2):
            x = torch.randn(4, 3, 5, 5) * 2 + 1
            x_ref, x_dev = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
            out_ref, out_dev = ref(x_ref), dev(x_dev)
            cotangent = torch.randn_like(out_ref)
            out_ref.backward(cotangent)
            out_dev.backward(cotangent.to("tpu"))
            torch.testing.assert_close(out_dev.cpu(), out_ref.detach(), atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(x_dev.grad.cpu(), x_ref.grad, atol=1e-5, rtol=1e-4)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(dev.state_dict()[name].cpu(), value, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(dev.weight.grad.cpu(), ref.weight.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(dev.bias.grad.cpu(), ref.bias.grad, atol=1e-5, rtol=1e-4)
    assert torchtpu_compile.stats()["eager_fallbacks"] == 0


@pytest.mark.parametrize("running_stats", [False, True], ids=["batch_stats", "running_stats"])
def test_bf16_batch_statistics_are_computed_in_float32(running_stats):
    # torch-mlir's lowering of training-mode native_batch_norm kept bf16 statistics: instance
    # norm of bf16 data was off by up to 0.19 where one rounding of the float32 answer is 0.06.
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 6, 50, generator=g) * 4 + 3).bfloat16()
    w, b = ((torch.randn(6, generator=g) * 5).bfloat16() for _ in range(2))
    stats = (torch.randn(6, generator=g).bfloat16(), torch.rand(6, generator=g).bfloat16() + 1) \
        if running_stats else (None, None)

    def norm(x, w, b, mean, var):
        return torch.nn.functional.instance_norm(x, mean, var, weight=w, bias=b, eps=0.6)
    exact = norm(*(t if t is None else t.float() for t in (x, w, b, *stats)))
    with config.patch(strict=True):
        out = norm(*(t if t is None else t.to("tpu") for t in (x, w, b, *stats)))
    # Within one bf16 rounding of the float32 result.
    torch.testing.assert_close(out.cpu().float(), exact, rtol=2 ** -8, atol=1e-3)


def test_unsupported_op_falls_back_counted_and_strict_raises():
    torchtpu_compile.reset_stats()
    x_cpu = torch.tensor([0.0, 1.5, 0.0, 2.0])
    x = x_cpu.to("tpu")
    out = x.unique()  # data-dependent shape: cannot be one static program
    assert out.device == TPU
    torch.testing.assert_close(out.cpu(), x_cpu.unique())
    assert torchtpu_compile.stats()["fallback_ops"].get("aten._unique2.default") == 1
    with config.patch(strict=True):
        with pytest.raises(Exception, match="aten.masked_select.*cannot run on the tpu device"):
            x.masked_select(x > 1)


def test_nonzero_runs_on_the_device():
    # It ran on a host copy (an error under TORCHTPU_STRICT=1), which stopped generate()'s
    # prompt lookup and assisted decoding; now one sync for its length, as on CUDA. NaN and
    # -0.0, a transposed input, torch.where(cond), a 0-d and an empty input.
    x = torch.tensor([[0.0, float("nan"), -0.0], [3.0, 0.0, 1.0]])
    mask = torch.tensor([[True, False], [False, True], [True, True]]).t()

    def nonzeros(x, mask):
        return (x.nonzero(), mask.nonzero(), torch.where(x), torch.argwhere(x[0, 1]),
                x[:0].nonzero())
    torchtpu_compile.reset_stats()
    with config.patch(strict=True):
        got = nonzeros(x.to("tpu"), mask.to("tpu"))
    for g, want in zip(pytree.tree_leaves(got), pytree.tree_leaves(nonzeros(x, mask))):
        assert g.device == TPU
        assert torch.equal(g.cpu(), want) and g.shape == want.shape
    assert torchtpu_compile.stats()["fallback_ops"] == {}


def test_ops_compile_once_per_signature():
    x = torch.randn(8, 8, device="tpu")
    (x * 2 + 1).sum().cpu()
    before = torchtpu_compile.stats()["eager_programs_compiled"]
    for _ in range(3):
        (x * 2 + 1).sum().cpu()
    assert torchtpu_compile.stats()["eager_programs_compiled"] == before


def test_registration_leaves_cpu_and_inductor_alone():
    # In a fresh process: the device autoloads at `import torch` and nothing else changes.
    code = (
        "import torch\n"
        "assert torch.ones(1, device='tpu').device.type == 'tpu'\n"
        "x = torch.randn(16)\n"
        "f = torch.compile(lambda a: (a.sin() * 2).relu())\n"   # Inductor, the default
        "y = f(x)\n"
        "assert y.device.type == 'cpu'\n"
        "torch.testing.assert_close(y, (x.sin() * 2).relu())\n"
        "assert (torch.arange(3) * 2).tolist() == [0, 2, 4]\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")


@pytest.mark.parametrize("first_import", ["torchtpu_eager", "torchtpu_compile"])
def test_importing_our_package_before_torch(first_import):
    # `import torchtpu_eager` first makes its own `import torch` run torch's autoload of it,
    # while it is half-initialized; that once failed with a circular import.
    code = (f"import {first_import}\n"
            "import torch\n"
            "print((torch.ones(2, device='tpu') * 2).sum().item())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "4.0"


def test_aot_artifact_runs_on_tpu_tensors(tmp_path):
    from tests.support import aot_factories
    from torchtpu_compile import aot
    model, (x,) = aot_factories.mlp()
    path = str(tmp_path / "mlp.tpu")
    aot.compile(model, (x,)).save(path)
    out = aot.load(path)(x.to("tpu"))
    assert out.device == TPU
    torch.testing.assert_close(out.cpu(), model(x), atol=1e-5, rtol=1e-5)


def test_new_float_arguments_do_not_compile_again():
    x_cpu = torch.randn(5)
    x = x_cpu.to("tpu")
    for value in (0.5, 0.25, -3.0):  # the second value lifts the floats into an input
        torch.testing.assert_close((x * value).cpu(), x_cpu * value)
        torch.testing.assert_close(x.add(x, alpha=value).cpu(), x_cpu.add(x_cpu, alpha=value))
        torch.testing.assert_close(x.addcdiv(x, x.abs() + 1, value=value).cpu(),
                                   x_cpu.addcdiv(x_cpu, x_cpu.abs() + 1, value=value))
    before = torchtpu_compile.stats()["eager_programs_compiled"]
    for value in (0.125, 7.0):
        torch.testing.assert_close((x * value).add(x, alpha=value).cpu(),
                                   (x_cpu * value).add(x_cpu, alpha=value))
    assert torchtpu_compile.stats()["eager_programs_compiled"] == before


FLOAT_SLOT_OPS = {
    "lt": lambda x, s: x < s, "le": lambda x, s: x <= s, "gt": lambda x, s: x > s,
    "ge": lambda x, s: x >= s, "eq": lambda x, s: x == s, "ne": lambda x, s: x != s,
    "clamp": lambda x, s: x.clamp(-abs(s), abs(s)), "clamp_min": lambda x, s: x.clamp(min=s),
    "clamp_max": lambda x, s: torch.clamp_max(x, s),
}


@pytest.mark.parametrize("op", list(FLOAT_SLOT_OPS))
def test_comparisons_and_clamps_with_new_floats_compile_once(op):
    # Their floats sit in Scalar slots: each new value (LBFGS's line search, a moving
    # threshold) compiled a program. The Tensor twin takes them as an input. Half dtypes keep
    # exact keys (eager rounds the float to them once; through float32 would be twice), and
    # their values stay eager's: bf16(0.1001) < 0.1001 is False in bf16.
    fn = FLOAT_SLOT_OPS[op]
    g = torch.Generator().manual_seed(0)
    x_cpu = torch.randn(16, generator=g)
    x_cpu[:3] = torch.tensor([0.30000001192092896, -0.0, float("nan")])
    inputs = [x_cpu, torch.tensor([2, -3, 7, 2 ** 40 + 1]), x_cpu.to(torch.float64)]
    for x_cpu in inputs:
        x = x_cpu.to("tpu")
        for s in (0.5, -0.25):  # the second value lifts the floats into an input
            torch.testing.assert_close(fn(x, s).cpu(), fn(x_cpu, s), equal_nan=True)
        before = torchtpu_compile.stats()["eager_programs_compiled"]
        for s in (0.1, 0.30000001, 2.5, -7.75, float("inf")):
            torch.testing.assert_close(fn(x, s).cpu(), fn(x_cpu, s), equal_nan=True)
        assert torchtpu_compile.stats()["eager_programs_compiled"] == before, x_cpu.dtype
    for dtype in (torch.bfloat16, torch.float16):
        x_cpu = torch.tensor([0.1, 0.1001, 2.5, 65504.0]).to(dtype)
        for s in (0.5, 0.1001, 0.10009765625, 65504.5, 1e-8):
            try:
                expected = fn(x_cpu, s)
            except RuntimeError:  # a clamp bound beyond half's range, in eager's words
                with pytest.raises(RuntimeError, match="without overflow"):
                    fn(x_cpu.to("tpu"), s).cpu()
                continue
            torch.testing.assert_close(fn(x_cpu.to("tpu"), s).cpu(), expected)


def test_a_float_an_op_consumes_is_never_lifted_into_an_input():
    # fill_ of an int tensor truncates its float while tracing: both sentinels became the same
    # 0, the graph read no input, and every later value (-2.7) filled 0 with no error.
    for dtype in (torch.int64, torch.float32):
        x = torch.zeros(3, dtype=dtype, device="tpu")
        for value in (2.7, -2.7, -3.5):
            assert torch.equal(x.fill_(value).cpu(), torch.zeros(3, dtype=dtype).fill_(value))
        y, y_cpu = torch.arange(5, device="tpu"), torch.arange(5)
        for i, value in enumerate((2.9, -2.9, 1.5)):
            y[i], y_cpu[i] = value, value
        assert torch.equal(y.cpu(), y_cpu)


def test_an_op_that_compiles_for_every_new_float_says_so(caplog):
    # pow's exponent sits in a Scalar slot, where a float cannot become an input: each new
    # exponent is a new program. Results stay right; after a few, the log names the op.
    from torchtpu_eager import dispatch
    x_cpu = torch.rand(4) + 0.5
    x = x_cpu.to("tpu")
    with caplog.at_level("WARNING", logger="torchtpu"):
        for i in range(dispatch.FLOAT_RECOMPILE_WARNING + 1):
            exponent = 1.0 + i / 7
            torch.testing.assert_close((x ** exponent).cpu(), x_cpu ** exponent)
    warnings = [r.getMessage() for r in caplog.records if "differ only in its float" in
                r.getMessage()]
    assert len(warnings) == 1 and "aten.pow.Tensor_Scalar" in warnings[0]


def test_adam_loop_stops_compiling():
    # Adam's bias corrections are new floats every step: they must not mean new programs.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    model.to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.randn(5, 6).to("tpu"), torch.randn(5, 2).to("tpu")

    def step():
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    before = torchtpu_compile.stats()["eager_programs_compiled"]
    for _ in range(3):
        step()
    assert torchtpu_compile.stats()["eager_programs_compiled"] == before


def test_deepcopy_of_a_tpu_model_is_independent():
    import copy
    model = torch.nn.Linear(3, 2).to("tpu")
    twin = copy.deepcopy(model)
    assert isinstance(twin.weight, torch.nn.Parameter) and twin.weight.device == TPU
    torch.testing.assert_close(twin.weight.cpu(), model.weight.cpu())
    with torch.no_grad():
        twin.weight.add_(1)
    torch.testing.assert_close(twin.weight.cpu(), model.weight.cpu() + 1)


def test_deepcopy_follows_eagers_rules_for_parameters_tensors_and_non_leaves():
    # Parameters were copied with their gradient (Parameter.__deepcopy__ drops it: a deepcopy
    # for an EMA or teacher model doubled the gradients' memory), tensors without their
    # attributes, and non-leaf tensors copied where eager raises.
    import copy
    outcomes = {}
    for device in ("cpu", "tpu"):
        model = torch.nn.Linear(3, 2).to(device)
        model(torch.ones(1, 3, device=device)).sum().backward()
        leaf = torch.ones(2, device=device, requires_grad=True)
        leaf.note, leaf.grad = "kept", torch.full((2,), 3.0, device=device)
        twin, leaf_copy = copy.deepcopy(model), copy.deepcopy(leaf)
        with pytest.raises(RuntimeError, match="Only Tensors created explicitly") as raised:
            copy.deepcopy(leaf * 2)
        outcomes[device] = (twin.weight.grad is None, isinstance(twin.weight, torch.nn.Parameter),
                            leaf_copy.note, leaf_copy.grad.cpu().tolist(),
                            leaf_copy.requires_grad, str(raised.value))
    assert outcomes["tpu"] == outcomes["cpu"]


def test_deepcopy_keeps_views_of_one_storage_views_of_one():
    # Each tensor was cloned alone: a write to a copied base missed its copied views, whose
    # strides and offsets were a dense tensor's. Eager copies each storage once.
    import copy
    seen = {}
    for device in ("cpu", "tpu"):
        x = torch.arange(12.0, device=device)
        twin = copy.deepcopy({"x": x, "tail": x[4:], "t": x.view(3, 4).t(),
                              "every_other": x.view(3, 4)[:, ::2]})
        twin["x"].add_(100)
        seen[device] = {name: (t.cpu().tolist(), t.stride(), t.storage_offset())
                        for name, t in twin.items()}
        assert x.cpu()[0] == 0  # the original is apart
    assert seen["tpu"] == seen["cpu"]


@pytest.mark.parametrize("make_view", [
    lambda b: b.as_strided((4, 4), (3, 1)), lambda b: b.as_strided((2,), (1,), 9),
    lambda b: b[2:].as_strided((3,), (1,), 8), lambda b: b.clone().as_strided_((4, 4), (3, 1)),
], ids=["rows", "offset", "of_a_view", "in_place"])
def test_a_view_past_its_storage_raises_eagers_error(make_view):
    # A meta tensor's storage has no bounds: the view was made, its reads clamped to the last
    # element ([9, 9, 9, 9] as its last row) and its writes landed on it
    base = torch.arange(10.0)
    with pytest.raises(RuntimeError) as expected:
        make_view(base)
    with pytest.raises(RuntimeError) as actual:
        make_view(base.to("tpu"))
    assert str(actual.value) == str(expected.value)
    fits = base.to("tpu").as_strided((3, 4), (3, 1))   # the last element, 9, and no further
    assert torch.equal(fits.cpu(), base.as_strided((3, 4), (3, 1)))


def test_conjugate_and_negative_views_are_computed_not_aliased():
    # conj() and _neg_view() only set a bit on the view, which a storage view cannot carry:
    # the values were read unconjugated (fft.ifft of a real input was wrong by its imaginary
    # part). Compared with the host, and after a later op that reads them.
    x = torch.randn(4, 3, dtype=torch.complex64)
    t = x.to("tpu")
    torch.testing.assert_close(t.conj().cpu(), x.conj().resolve_conj())
    torch.testing.assert_close((t.conj() * 1).cpu(), x.conj() * 1)
    torch.testing.assert_close(torch._neg_view(t).cpu(), -x)
    real = torch.randn(5, 6)
    torch.testing.assert_close(torch.fft.ifft(real.to("tpu")).cpu(), torch.fft.ifft(real))


def test_writes_into_computed_views_raise():
    # conj() is computed as a new tensor: a write into it stayed in the copy, and the base
    # silently kept its values where eager writes through.
    z = torch.zeros(4, dtype=torch.complex64, device="tpu")
    conjugate = z.conj()
    torch.testing.assert_close((conjugate + 1).cpu(), torch.ones(4, dtype=torch.complex64))
    with pytest.raises(RuntimeError, match="computes as a new tensor rather than a view"):
        conjugate[0] = 1j
    with pytest.raises(RuntimeError, match="computes as a new tensor rather than a view"):
        conjugate.add_(1)
    conjugate.clone().add_(1)  # a copy is the caller's own
    torch.testing.assert_close(z.cpu(), torch.zeros(4, dtype=torch.complex64))


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_a_view_of_another_dtype_and_its_base_see_each_other_s_writes_as_eager(mode):
    # view(dtype) is computed (a buffer has one dtype): a write into its base left the view
    # with the old bits, and a write into the view raised.
    def steps(device):
        seen = []
        x = torch.tensor([1.0, 2.0, -3.0, 0.5], device=device)
        bits = x.view(torch.int32)
        x.mul_(2)                                    # the base's write reaches the view
        seen.append(bits.clone())
        bits.add_(1)                                 # the view's write reaches the base
        seen.append(x.clone())
        raw = x.view(torch.uint8)                    # another width
        x[0] = 7.0
        seen.append(raw.clone())
        raw[4:8] = torch.tensor([0, 0, 128, 63], dtype=torch.uint8, device=device)  # 1.0
        seen.append(x.clone())
        seen.append(x.view(torch.int16).clone())     # two bitcasts of widths in one program
        y = torch.arange(6.0, device=device).reshape(2, 3)
        row = y[1].view(torch.int32)                 # a view of a view
        y.add_(1)
        seen.append(row.clone())
        return seen

    expected = steps("cpu")
    torch.tpu.set_eager_mode(mode)
    try:
        # (a recording is compiled as one program from its fifth time on)
        runs = [[t.cpu() for t in steps("tpu")] for _ in range(6)]
    finally:
        torch.tpu.set_eager_mode("strict")
    for got in runs:
        for value, want in zip(got, expected):
            assert torch.equal(value, want), (value, want)


@pytest.mark.parametrize("optimizer", ["Adam", "AdamW"])
@pytest.mark.parametrize("foreach", [False, True])
def test_adam_on_a_complex_parameter_matches_eager(optimizer, foreach):
    # The optimizers update a complex parameter and its state through torch.view_as_real in
    # place (the complex-numbers tutorial): the device refused to write into the real view.
    torch.manual_seed(0)
    w0, b0, x = torch.randn(3, 4, dtype=torch.cfloat), torch.randn(4), torch.randn(
        5, 3, dtype=torch.cfloat)
    results = []
    for device in ("cpu", "tpu"):
        w, b = (t.clone().to(device).requires_grad_() for t in (w0, b0))
        opt = getattr(torch.optim, optimizer)([w, b], lr=0.1, foreach=foreach,
                                              amsgrad=foreach)
        for _ in range(3):
            opt.zero_grad()
            ((x.to(device) @ w).abs() + b).square().sum().backward()
            opt.step()
        state = opt.state[w]
        results.append([t.detach().cpu() for t in (w, b, state["exp_avg"], state["exp_avg_sq"])])
    for got, expected in zip(results[1], results[0]):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_writes_through_view_as_real_and_view_as_complex_reach_their_base_as_eager(mode):
    def steps(z, f):
        r = torch.view_as_real(z)
        r.mul_(2)
        seen = [z.clone()]
        z.add_(1)                        # the base's write reaches the view
        seen.append(r.clone())
        r[1].zero_()                     # a view of the view
        torch.view_as_real(z[1:])[:, 1].fill_(7)
        seen += [z.clone(), r.clone()]
        z.real.mul_(3)
        seen += [z.clone(), r.clone()]
        torch.view_as_complex(r).mul_(1j)    # a view of a view of z
        seen += [z.clone(), r.clone()]
        c = torch.view_as_complex(f)
        c.mul_(2)
        seen.append(f.clone())
        f.add_(1)
        seen.append(c.clone())
        return seen

    z, f = torch.randn(3, dtype=torch.cfloat), torch.randn(4, 2)
    expected = steps(z.clone(), f.clone())
    torch.tpu.set_eager_mode(mode)
    try:
        got = [t.cpu() for t in steps(z.to("tpu"), f.to("tpu"))]
    finally:
        torch.tpu.set_eager_mode("strict")
    for value, want in zip(got, expected):
        torch.testing.assert_close(value, want)


def test_inplace_view_ops_change_the_tensors_geometry():
    # t_(), unsqueeze_(), transpose_() change the tensor's own size and strides; they were
    # traced as ops, which wrote transposed values under the old size (stft was wrong).
    x = torch.arange(6.0).reshape(2, 3)
    t = x.to("tpu")
    flat = t.view(6)
    t.t_()
    assert t.shape == (3, 2) and t.stride() == (1, 3)
    torch.testing.assert_close(t.cpu(), x.t())
    t.mul_(2)  # still a view of the same storage
    torch.testing.assert_close(flat.cpu(), torch.arange(6.0) * 2)
    u = x.to("tpu")
    u.unsqueeze_(0).transpose_(1, 2)
    torch.testing.assert_close((u + 1).cpu(), x.unsqueeze(0).transpose(1, 2) + 1)
    signal = torch.randn(100)
    torch.testing.assert_close(torch.stft(signal.to("tpu"), 20, return_complex=True).cpu(),
                               torch.stft(signal, 20, return_complex=True))


def test_assigning_data_rebinds_the_tensor_to_the_new_storage():
    # PyTorch's `.data` setter copies only the C++ metadata: x took y's shape over its own old
    # values (a parameter replaced by `p.data = ...` kept training its old weights).
    for device in ("cpu", "tpu"):
        x = torch.arange(12.0, device=device).requires_grad_()
        base = torch.zeros(4, 6, device=device)
        x.data = base[1:, ::2]
        base.add_(3)  # x views base's storage now
        p = torch.nn.Parameter(torch.arange(4.0, device=device))
        p.data = p.data.half()
        if device == "cpu":
            want = (x.detach().clone(), x.stride(), p.detach().clone())
    assert x.requires_grad and x.stride() == want[1] and p.dtype == torch.float16
    torch.testing.assert_close(x.detach().cpu(), want[0])
    torch.testing.assert_close(p.detach().cpu(), want[2])


def _results(fn):
    """``fn(device)`` on the host and on tpu: (value, or eager's error) for each."""
    out = []
    for device in ("cpu", "tpu"):
        try:
            out.append(fn(device))
        except RuntimeError as exc:
            out.append(str(exc))
    return out


def _assert_same_results(cpu, tpu):
    """Each of ``fn``'s results on tpu (``_results``) equals the host's: tensors close, the
    rest (shapes, strides, offsets) equal."""
    for got, want in zip(tpu, cpu):
        if isinstance(want, torch.Tensor):
            torch.testing.assert_close(got, want)
        else:
            assert got == want


def _out_into(make_out, shape):
    def fn(device):
        out = make_out(device)
        with pytest.warns(UserWarning, match="was resized") if out.numel() else \
                contextlib.nullcontext():
            assert torch.add(torch.arange(12.0, device=device).reshape(shape), 1, out=out) is out
        return out.shape, out.stride(), out.storage_offset(), out.cpu()
    return fn


@pytest.mark.parametrize("make_out, shape", [
    (lambda d: torch.empty(0, device=d), (3, 4)),
    (lambda d: torch.zeros(5, device=d), (12,)),
], ids=["empty", "too_small"])
def test_out_of_another_shape_is_resized_as_eager(make_out, shape):
    # The result's buffer was stored under the out tensor's old shape: an empty out= stayed
    # empty, a (5,) one read back 12 values.
    cpu, tpu = _results(_out_into(make_out, shape))
    assert cpu[:3] == tpu[:3]
    torch.testing.assert_close(tpu[3], cpu[3])


def test_resize_set_and_their_views():
    def fn(device):
        x = torch.arange(4.0, device=device)
        x.resize_(2, 3)  # grows: the old values first
        z = torch.arange(12.0, device=device)
        z.resize_as_(torch.zeros(2, 2, device=device))  # was traced: a (12,) under (2, 2)
        s, base = torch.zeros(3, device=device), torch.zeros(4, 4, device=device)
        s.set_(base.t()[1:])
        s.add_(1)  # reaches base
        return (x.shape, x.flatten()[:4].cpu(), z.shape, z.stride(), z.cpu(), s.shape,
                s.stride(), base.cpu())
    _assert_same_results(*_results(fn))


def test_a_storage_grown_under_its_views_and_aliases_keeps_them_as_eager():
    # resize_ (and an out= of another size) gave the grown tensor a new storage and left its
    # views and set_ aliases on the old one: writes through either no longer reached the other
    def fn(device):
        x = torch.arange(4.0, device=device)
        view, alias = x.view(2, 2), torch.empty(0, device=device)
        alias.set_(x)
        x.resize_(8)
        x[:4].fill_(1)
        alias[1] = 5
        out = torch.zeros(3, device=device)
        out_view = out[1:]
        torch.add(torch.arange(6.0, device=device), 1, out=out)
        return (view.cpu(), alias.cpu(), x[:4].cpu(), out_view.cpu(), out_view.stride(),
                out_view.data_ptr() - out.data_ptr())
    _assert_same_results(*_results(fn))


@pytest.mark.parametrize("write", [
    lambda x: x[1:].add_(x[:-1]),
    lambda x: x[1:].copy_(x[:-1]),
    lambda x: torch.add(x[:-1], 1, out=x[1:]),
    lambda x: x.add_(x[0]),
    lambda x: x[:3].unsqueeze(0).expand(2, 3).add_(1),
    lambda x: x[:3].expand(2, 3).copy_(torch.ones(2, 3, device=x.device)),
    lambda x: x[:3].expand(2, 3).fill_(1),  # eager allows this one
    # disjoint views of one storage: allowed (the check's host run once raised IndexError)
    lambda x: x[:5].index_add_(0, torch.tensor([1, 2], device=x.device), x[5:7]),
    # the written tensor passed again: eager refuses the index ops, allows the pointwise
    lambda x: x.index_add_(0, torch.arange(12, device=x.device), x),
    lambda x: torch.gather(x, 0, torch.zeros(12, dtype=torch.long, device=x.device), out=x),
    lambda x: x.mul_(x),
], ids=["partial_add_", "partial_copy_", "partial_out", "dense_and_element", "expanded_add_",
        "expanded_copy_", "expanded_fill_", "disjoint_index_add_", "self_index_add_",
        "self_gather_out", "self_mul_"])
def test_writes_through_overlapping_memory_raise_as_eager(write):
    # Ops run on functional values here, so these returned a value where eager raises
    # "unsupported operation: ... refer to a single memory location".
    def fn(device):
        x = torch.arange(12.0, device=device)
        write(x)
        return x.cpu()
    cpu, tpu = _results(fn)
    if isinstance(cpu, str):
        assert tpu == cpu
    else:
        torch.testing.assert_close(tpu, cpu)


@pytest.mark.parametrize("write", [
    lambda d: torch.ones(3, dtype=torch.long, device=d).mul_(2.5),
    lambda d: torch.ones(3, dtype=torch.bool, device=d).mul_(torch.ones(3, dtype=torch.long,
                                                                        device=d)),
    lambda d: torch.add(torch.ones(3, device=d), 1, out=torch.empty(3, dtype=torch.long,
                                                                   device=d)),
    lambda d: torch.ones(3, dtype=torch.half, device=d).add_(torch.ones(3, device=d)),  # fine
], ids=["long_mul_float", "bool_mul_long", "float_out_long", "half_add_float"])
def test_results_an_output_cannot_hold_raise_as_eager(write):
    # Traced, a pointwise op's result was cast to its in-place or out= output's dtype without
    # a word (2.5 * 1 stored as 2) where eager raises "result type Float can't be cast to the
    # desired output type Long".
    cpu, tpu = _results(lambda d: write(d).cpu())
    if isinstance(cpu, str):
        assert tpu == cpu
    else:
        torch.testing.assert_close(tpu, cpu)


def test_integer_indexing_runs_on_the_device_and_masks_on_the_host():
    # aten.index is tagged data-dependent for its boolean masks; integer indices (negative
    # ones too) are a static gather and ran on the host for nothing.
    x = torch.randn(5, 4)
    i, j = torch.tensor([0, -2, 3]), torch.tensor([[1], [2]])
    t = x.to("tpu")
    torchtpu_compile.reset_stats()
    torch.testing.assert_close(t[i.to("tpu")].cpu(), x[i])
    torch.testing.assert_close(t[j.to("tpu"), i.to("tpu")].cpu(), x[j, i])
    torch.testing.assert_close(t[:, i.to("tpu")].cpu(), x[:, i])
    assert torchtpu_compile.stats()["fallback_ops"] == {}
    mask = x > 0
    torch.testing.assert_close(t[mask.to("tpu")].cpu(), x[mask])
    assert torchtpu_compile.stats()["fallback_ops"] == {"aten.index.Tensor": 1}


def test_host_index_tensors_index_a_tpu_tensor_as_on_cuda():
    # ATen's index kernels take indices on the host; `x[idx] = v` with a host idx raised a
    # device mismatch. The values must still be on the device, as on CUDA.
    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("tpu")
    i = torch.tensor([0, 2])
    torch.testing.assert_close(t[i].cpu(), x[i])
    x[i] = torch.arange(4.0)
    t[i] = torch.arange(4.0, device="tpu")
    torch.testing.assert_close(t.cpu(), x)
    with pytest.raises(RuntimeError, match="same device"):
        t[i] = torch.ones(4)


def test_inference_mode_results_move_and_cast_as_on_cpu():
    # Inference mode skips the autograd keys where PyTorch decomposes .to/.cpu/.reshape: they
    # reached the device whole, and .cpu() of any inference tensor raised ("Cannot copy out
    # of meta tensor").
    torch.manual_seed(0)
    model, x = torch.nn.Linear(3, 2), torch.randn(4, 3)
    tpu_model = torch.nn.Linear(3, 2).to("tpu")
    tpu_model.load_state_dict(model.state_dict())
    results = {}
    for device, m in (("cpu", model), ("tpu", tpu_model)):
        with torch.inference_mode():
            out = m(x.to(device))
            inside = (out.cpu(), out.to(torch.bfloat16).cpu(), out.reshape(8).cpu())
        results[device] = (*inside, out.cpu(), out.to("cpu", torch.float16))
    for got, want in zip(results["tpu"], results["cpu"]):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


def test_max_pool2d_with_the_default_stride_runs_on_the_device():
    # F.max_pool2d(x, k) leaves the stride empty (= the kernel); torch-mlir's lowering took it
    # for 1, the op failed to compile and ran on the host (the migration image script's pools).
    x = torch.randn(2, 3, 9, 8)
    with config.patch(strict=True):
        values, indices = F.max_pool2d(x.to("tpu"), 2, return_indices=True)
    want_values, want_indices = F.max_pool2d(x, 2, return_indices=True)
    torch.testing.assert_close(values.cpu(), want_values, rtol=0, atol=0)
    assert torch.equal(indices.cpu(), want_indices)


def test_a_sparse_tensor_moved_to_tpu_is_a_clear_error():
    # A device buffer is one dense array; the upload failed with "unsupported memory format
    # option Contiguous", which named nothing the user did.
    s = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([3.0, 4.0]), (2, 2))
    with pytest.raises(NotImplementedError, match="to_dense"):
        s.to("tpu")
    torch.testing.assert_close(s.to_dense().to("tpu").cpu(), s.to_dense())


def test_a_sparse_embedding_gradient_names_the_dense_option():
    # The user wrote no sparse tensor: the advice was .to_dense() and torch.sparse.mm only.
    embedding = torch.nn.Embedding(10, 4, sparse=True).to("tpu")
    with pytest.raises(NotImplementedError, match="sparse=False"):
        embedding(torch.tensor([1, 2], device="tpu")).sum().backward()


@pytest.mark.parametrize("make", [
    pytest.param(lambda: torch.eye(2).to_sparse().to("tpu"), id="coo.to(tpu)"),
    pytest.param(lambda: torch.eye(2).to_sparse_csr().to("tpu"), id="csr.to(tpu)"),
    pytest.param(lambda: torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.ones(1), (2, 2),
                                                 device="tpu"), id="sparse_coo_tensor(device=tpu)"),
    pytest.param(lambda: torch.eye(2, device="tpu").to_sparse(), id="tpu.to_sparse()"),
    pytest.param(lambda: torch.eye(2, device="tpu").to_sparse_csr(), id="tpu.to_sparse_csr()")])
def test_a_sparse_tensor_on_tpu_is_refused_naming_to_dense_in_strict_mode_too(make):
    # The constructors went to the lowering first: strict mode raised "failed to legalize
    # operation ... _sparse_coo_tensor_with_dims_and_tensors", and a CSR tensor's .to("tpu")
    # returned a tpu tensor that every op then refused ("found at least two devices, tpu:0
    # and tpu:0!").
    with config.patch(strict=True), pytest.raises(NotImplementedError, match=r"sparse.*to_dense"):
        make()

# Inputs whose checks live in the op's meta kernel: the device traced the op through its
# decompositions, which never ran that kernel, and returned a value where eager raises.
_META_CHECKED = {
    "avg_pool2d(divisor_override=0)": lambda x: F.avg_pool2d(x, 2, divisor_override=0),
    "adaptive_max_pool2d(output_size=[])": lambda x: F.adaptive_max_pool2d(x, []),
    "max_pool3d(padding=-1)": lambda x: F.max_pool3d(x[None], 2, padding=-1),
    "roll(shifts=[2, 1], dims=0)": lambda x: torch.roll(x, [2, 1], 0),
    "diagonal_copy(dim1=10000)": lambda x: torch.diagonal_copy(x, dim1=10000),
    "gather(out= of float64)": lambda x: torch.gather(
        x, 1, torch.zeros(3, 3, 2, 2, dtype=torch.int64, device=x.device),
        out=torch.empty(3, 3, 2, 2, dtype=torch.float64, device=x.device)),
    "kthvalue(k=3) of a 0-d": lambda x: torch.kthvalue(x.sum(), 3),
}


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("name", list(_META_CHECKED))
def test_inputs_a_meta_kernel_rejects_raise_eagers_error(name, strict):
    fn = _META_CHECKED[name]
    x = torch.arange(36.0).reshape(3, 3, 2, 2)
    with pytest.raises(Exception) as want:
        fn(x)
    before = dict(torchtpu_compile.stats()["fallback_ops"])
    with config.patch(strict=strict), pytest.raises(Exception) as got:
        fn(x.to("tpu")).cpu()
    assert isinstance(got.value, type(want.value)), got.value
    assert str(got.value) == str(want.value)
    assert torchtpu_compile.stats()["fallback_ops"] == before


def _out(dtype, shape=(20,)):
    return lambda x: torch.empty(shape, dtype=dtype, device=x.device)


# out= of a dtype other than the result's, on ops other than pointwise ones: eager refuses it
# (aminmax, complex) or computes in it (sum, cumsum). Traced, the result was cast into it.
_OUT_DTYPES = {
    "aminmax(out=(f32, f64))": (True, lambda x: torch.aminmax(
        x, dim=0, out=(_out(torch.float32)(x), _out(torch.float64)(x)))),
    "complex(f64, f64, out=c64)": (True, lambda x: torch.complex(
        x.double(), x.double(), out=_out(torch.complex64, (20, 20))(x))),
    "sum(out=f64)": (False, lambda x: torch.sum(x, 0, out=_out(torch.float64)(x))),
    "cumsum(out=f64)": (False, lambda x: torch.cumsum(x, 0, out=_out(torch.float64, (20, 20))(x))),
}


@pytest.mark.parametrize("name", list(_OUT_DTYPES))
def test_out_of_another_dtype_is_eagers_to_refuse_or_take(name):
    refused, fn = _OUT_DTYPES[name]
    x = torch.randn(20, 20)
    if not refused:
        # computed in fp32 and summed in XLA's order: fp32's tolerance on the fp64 result
        torch.testing.assert_close(fn(x.to("tpu")).cpu(), fn(x), rtol=1e-5, atol=1e-5)
        return
    with pytest.raises(RuntimeError) as want:
        fn(x)
    with pytest.raises(RuntimeError) as got:
        fn(x.to("tpu"))
    assert str(got.value) == str(want.value)


def test_new_float_arguments_of_a_double_op_keep_their_double_value():
    # Lifted floats were float32: x.add(y, alpha=t) on float64 tensors (LBFGS's step) was
    # wrong in the 8th digit from the second value of t on, with no error.
    x_cpu, y_cpu = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    x, y = x_cpu.to("tpu"), y_cpu.to("tpu")
    for value in (0.5, 0.123456789123, 1 / 3):
        torch.testing.assert_close(x.add(y, alpha=value).cpu(), x_cpu.add(y_cpu, alpha=value),
                                   rtol=1e-15, atol=1e-15)
        torch.testing.assert_close((x * value).cpu(), x_cpu * value, rtol=1e-15, atol=1e-15)
    # A double result whose only tensor is not double: linspace(4.3, end, dtype=float64) of an
    # int end started at 4.300000190734863 from the second start value on.
    for start, end in ((-2.0, 1), (4.3, -3), (0.1, 5)):
        end_cpu = torch.tensor(end)
        for space in (torch.linspace, torch.logspace):
            torch.testing.assert_close(
                space(start, end_cpu.to("tpu"), 50, dtype=torch.float64, device="tpu").cpu(),
                space(start, end_cpu, 50, dtype=torch.float64), rtol=1e-14, atol=1e-15)



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_torch_tensor_of_a_list_of_0_dim_tpu_tensors_reads_their_values(dtype):
    # torch.tensor reads its elements with Python dispatch off: float(x) of a tpu element
    # reached the backend key's boxed fallback and raised PyTorch's "func != nullptr" assert
    # (actor-critic's torch.tensor([R]), R from a tpu tensor). CPU and CUDA build the tensor.
    values = torch.tensor([1.5, 0.0, -2.0]).to(dtype)
    r, r_cpu = values.to("tpu")[0], values[0]
    for make in (lambda x: torch.tensor([x]), lambda x: torch.tensor([[x, x]]),
                 lambda x: torch.as_tensor([x])):
        out, ref = make(r), make(r_cpu)
        assert out.device == ref.device and out.dtype == ref.dtype and torch.equal(out, ref)
    out = torch.tensor([r], device="tpu")
    assert out.device == TPU and torch.equal(out.cpu(), torch.tensor([r_cpu]))


def test_torch_tensor_of_a_deferred_tpu_value_runs_its_recording():
    # In defer-and-fuse mode the element's read runs the pending recording, whose program is
    # traced with fake tensors; with the Python key off (inside torch.tensor) they were real
    # tensors, and an expanded view (Categorical.log_prob's broadcast) reached the lowering
    # as uninitialized values: "Could not deduce type from value info" (actor-critic).
    from torch.distributions import Categorical
    probs_cpu, action_cpu = torch.tensor([[0.3, 0.7]]), torch.tensor([1])
    saved = torch.tpu.get_eager_mode()
    torch.tpu.set_eager_mode("defer_and_fuse")
    try:
        log_prob = Categorical(probs_cpu.to("tpu")).log_prob(action_cpu.to("tpu"))
        out = torch.tensor([log_prob[0]])
    finally:
        torch.tpu.set_eager_mode(saved)
    torch.testing.assert_close(out, torch.tensor([Categorical(probs_cpu).log_prob(action_cpu)[0]]))


def test_a_dlpack_import_of_a_tpu_tensor_raises_a_clear_error_when_used():
    # It came back a plain tensor on tpu:0 with no buffer; any op on it recursed through the
    # host fallback until Python's recursion limit.
    imported = torch.from_dlpack(torch.utils.dlpack.to_dlpack(torch.ones(3, device="tpu")))
    with pytest.raises(RuntimeError, match="torchtpu did not make"):
        imported * 2


_UNSIGNED_WIDE = [torch.uint16, torch.uint32, torch.uint64]


def _written_through_views(dtype, device):
    # A write through a view runs a program on the device: torch-mlir has none for these
    # dtypes (LoweringError), which are read through views on the host.
    x = torch.arange(12).view(3, 4).to(dtype).to(device)
    x[1, 1].copy_(torch.tensor(9).to(dtype).to(device))
    x[2] = torch.arange(4).to(dtype).to(device)
    x[:, 0].fill_(7)
    x.t()[3, 1:] = torch.tensor([5, 6]).to(dtype).to(device)
    return x


_ON_UNSIGNED = {
    "zeros": lambda dt, d: torch.zeros(3, dtype=dt, device=d),
    "ones": lambda dt, d: torch.ones(2, 3, dtype=dt, device=d),
    "full": lambda dt, d: torch.full((3,), 2 ** 15 + 5, dtype=dt, device=d),
    "strided read": lambda dt, d: torch.tensor([1, 2, 3, 4, 5], dtype=dt).to(d)[::2].contiguous(),
    "fill_": lambda dt, d: torch.tensor([1, 2, 3], dtype=dt).to(d).fill_(7),
    "writes through views": _written_through_views,
}


@pytest.mark.parametrize("eager_mode", ["strict", "defer_and_fuse"], indirect=True)
@pytest.mark.parametrize("dtype", _UNSIGNED_WIDE, ids=str)
@pytest.mark.parametrize("case", list(_ON_UNSIGNED))
def test_unsigned_wide_ints_are_made_and_read_as_eager(case, dtype, eager_mode):
    # Never-written storage was zeroed by a program, and strided reads gathered by one, which
    # torch-mlir cannot build for uint16/32/64: torch.zeros raised LoweringError. fill_(7)
    # took its 0-d value for a list of one (shape () read as "no shape").
    fn = _ON_UNSIGNED[case]
    want = fn(dtype, "cpu")
    got = fn(dtype, "tpu").cpu()
    assert got.dtype == want.dtype and torch.equal(got, want), (got, want)


def test_a_dtype_xla_cannot_hold_is_refused_by_name():
    # numpy's "Got unsupported ScalarType ComplexHalf" named neither the device nor a way out.
    half_complex = torch.tensor([1 + 2j], dtype=torch.complex32)
    with pytest.raises(TypeError, match=r"torch.complex32 tensors cannot live on an XLA "
                                        r"device.*torch.complex64"):
        half_complex.to("tpu")


def test_complex128_is_written_through_views_as_eager():
    want = _written_through_views(torch.complex128, "cpu")
    got = _written_through_views(torch.complex128, "tpu").cpu()
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_ops_making_complex_results_xla_lacks_as_a_program():
    # The number's complex128 tensor was zeroed by a program torch-mlir cannot build
    # (LoweringError); it runs on the host now, as other complex128 ops do. A complex32
    # result, which XLA cannot hold, is refused by name.
    mask = torch.tensor([True, False, True])
    x = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    want = torch.where(mask, x, 2j)
    got = torch.where(mask.to("tpu"), x.to("tpu"), 2j).cpu()
    assert got.dtype == want.dtype and torch.equal(got, want)
    with pytest.raises(TypeError, match="torch.complex32"):
        torch.where(mask.to("tpu"), 2j, x.half().to("tpu")).cpu()


@pytest.mark.parametrize("call", [
    lambda t, h: torch.allclose(t, h), lambda t, h: torch.allclose(h, t),
    lambda t, h: torch.bincount(torch.tensor([0, 1, 1]).to("tpu"), h[:3]),
    lambda t, h: torch.masked_select(t, h > 2), lambda t, h: torch.masked_select(h, t > 2),
], ids=["allclose", "allclose_host_first", "bincount", "masked_select", "masked_select_host"])
def test_host_run_ops_given_a_host_tensor_raise_cudas_device_error(call):
    # Ops that run on the host (data-dependent shapes, host values) took a host tensor as one
    # of theirs: allclose(tpu, cpu) returned True, masked_select with a host mask a result.
    host = torch.arange(6.0)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        call(host.to("tpu"), host)


@pytest.mark.parametrize("write", [
    lambda h, t: h.add_(t), lambda h, t: h.mul_(t), lambda h, t: h.__iadd__(t),
    lambda h, t: torch.add(h, t, out=h)], ids=["add_", "mul_", "iadd", "out"])
def test_a_host_scalar_written_by_a_tpu_op_raises_cudas_device_error(write):
    # running = torch.tensor(0.); running += loss: a host 0-d tensor may join a tpu op as an
    # input only; as the one written it raised AttributeError '_st'.
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        write(torch.tensor(1.0), torch.tensor(2.0, device="tpu"))
    assert (torch.tensor(1.0) + torch.tensor(2.0, device="tpu")).device == TPU


@pytest.mark.parametrize("space", [torch.linspace, torch.logspace])
def test_a_factory_of_tpu_ends_told_device_cpu_builds_on_the_cpu(space):
    # Its device-generic kernel reads the ends and builds where device= says (the default
    # device when not given: PyTorch's argument parser fills it in), as on CUDA; the result
    # was a tpu tensor.
    end = torch.tensor(3.0)
    for device in ("cpu", None):
        got = space(0.5, end.to("tpu"), 4, device=device)
        assert got.device.type == "cpu"
        torch.testing.assert_close(got, space(0.5, end, 4))
    got = space(0.5, end.to("tpu"), 4, device="tpu")
    assert got.device == TPU
    torch.testing.assert_close(got.cpu(), space(0.5, end, 4))


def test_storage_identity_equality_across_devices_and_parameter_repr_are_cudas():
    # is_set_to read PyTorch's placeholder storage (False even for x itself); equal with a
    # host tensor compared on the host where CUDA raises; a tpu Parameter printed as
    # "tensor(TpuTensor(...))".
    x = torch.arange(6.0).to("tpu")
    assert x.is_set_to(x) and x.view(2, 3).is_set_to(x.view(2, 3))
    assert not x.is_set_to(x.view(2, 3)) and not x.is_set_to(x.clone())
    assert not x[1:].is_set_to(x[:5])
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.equal(x, torch.arange(6.0))
    assert torch.equal(x, x.clone()) and not torch.equal(x, x + 1)
    weight = torch.nn.Parameter(torch.ones(2, 3))
    text = repr(torch.nn.Parameter(weight.detach().to("tpu")))
    assert text.startswith("Parameter containing:\ntensor([[1., 1., 1.],"), text
    assert text.endswith("device='tpu:0', requires_grad=True)"), text


def _fused_observer(x, per_channel_state):
    running_min, running_max, scale, zero_point = per_channel_state
    on = torch.ones(1, dtype=torch.long, device=x.device)
    return torch.fused_moving_avg_obs_fake_quant(
        x, on, on, running_min, running_max, scale, zero_point, 0.01, -128, 127, 0, True, True)


@pytest.mark.parametrize("case", ["nonzero_out", "masked_select_out", "per_channel_observer"])
def test_arguments_a_host_run_op_resizes_take_their_new_shape(case):
    # A host-run op resized a written argument (an out= of another shape; QAT's per-channel
    # observer starts its running min/max empty): its values were written under the old shape
    # (nonzero's out stayed empty; scale kept shape [1] over four values), so a per-channel QAT
    # model's observers restarted every step and trained away from CPU's.
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    x[1, 2] = 0.0

    def run(device):
        xd = x.to(device)
        if case == "nonzero_out":
            written = [torch.empty(0, 2, dtype=torch.long, device=device)]
            torch.nonzero(xd, out=written[0])
        elif case == "masked_select_out":
            written = [torch.empty(0, device=device)]
            torch.masked_select(xd, xd > 0, out=written[0])
        else:
            written = [torch.empty(0, device=device), torch.empty(0, device=device),
                       torch.ones(1, device=device),
                       torch.zeros(1, dtype=torch.int32, device=device)]
            for _ in range(2):   # the second call averages into the first's min and max
                out = _fused_observer(xd, written)
            written.append(out)
        return written

    for got, want in zip(run("tpu"), run("cpu")):
        assert got.shape == want.shape and got.stride() == want.stride()
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_a_dynamically_quantized_model_moved_to_the_device_runs_twice():
    # Its packed weights (a ScriptObject) went into the op cache's key, whose second lookup
    # compared keys: "'__eq__' is not implemented for LinearPackedParamsBase".
    torch.manual_seed(0)
    model = torch.ao.quantization.quantize_dynamic(
        torch.nn.Sequential(torch.nn.Linear(8, 4)), {torch.nn.Linear}, dtype=torch.qint8)
    x = torch.randn(2, 8)
    want = model(x)
    model.to("tpu")
    for _ in range(2):
        assert torch.equal(model(x.to("tpu")).cpu(), want)


def test_jit_trace_of_a_convolution_on_the_device_raises_instead_of_freezing_its_output():
    # The tracer never records convolution (only the _convolution CPU's kernel calls): traced
    # on tpu tensors, a CNN returned the example's output for every input, no error.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    example, other = torch.randn(1, 3, 6, 6), torch.randn(1, 3, 6, 6)
    with torch.no_grad():
        with pytest.raises(RuntimeError, match="trace the model on the CPU"):
            torch.jit.trace(model.to("tpu"), example.to("tpu"))
        want = model.cpu()(other)
        # The way the error gives (the traced module shares the model's parameters, as on CUDA)
        traced = torch.jit.trace(model, example).to("tpu")
        torch.testing.assert_close(traced(other.to("tpu")).cpu(), want)


@pytest.mark.parametrize("call", [
    lambda x: torch.choose_qparams_optimized(x.flatten(), x.numel(), 200, 0.16, 8),
    lambda x: torch.fbgemm_linear_quantize_weight(x),
    lambda x: (lambda w: (torch._saturate_weight_to_fp16(w), w))(x * 1e5),  # writes w too
], ids=["choose_qparams_optimized", "fbgemm_linear_quantize_weight", "saturate_to_fp16"])
def test_quantization_helpers_reading_cpu_memory_run_on_the_host(call):
    # Their kernels read the input through data_ptr(), on a tpu tensor no memory of its
    # values: choose_qparams_optimized gave (4.9e33, -1.7e38), other numbers at each call.
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    got, want = call(x.to("tpu")), call(x)
    for g, w in zip(pytree.tree_leaves(got), pytree.tree_leaves(want)):
        if isinstance(w, torch.Tensor):
            assert g.device.type == "tpu" and torch.equal(g.cpu(), w)
        else:
            assert g == w
    with pytest.raises(RuntimeError, match="FBGEMM's packed weights"):
        torch.fbgemm_pack_gemm_matrix_fp16(x.to("tpu"))


def test_pack_padded_sequence_refuses_tpu_lengths_as_cuda_does():
    # CUDA (and CPU's kernel) want host lengths; ours copied them over and PackedSequence then
    # refused its tpu batch_sizes, with a message about building PackedSequences by hand.
    x = torch.randn(3, 5, 2, device="tpu")
    for enforce_sorted in (True, False):
        with pytest.raises(RuntimeError, match="'lengths' argument should be a 1D CPU int64 "
                                               "tensor, but got 1D tpu:0 Long tensor"):
            torch.nn.utils.rnn.pack_padded_sequence(
                x, torch.tensor([5, 3, 2], device="tpu"), batch_first=True,
                enforce_sorted=enforce_sorted)
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor([5, 3, 2]),
                                                     batch_first=True)
    assert packed.data.device == TPU and packed.batch_sizes.device.type == "cpu"
