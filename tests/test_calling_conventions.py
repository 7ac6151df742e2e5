"""Each calling convention a graph can have, against eager PyTorch on CPU."""
import copy

import pytest
import torch

import torchtpu_compile
import torchtpu_eager  # noqa: F401  (the tpu device)
from tests.support.helpers import compile_tpu
from torchtpu_compile import config

pytestmark = pytest.mark.usefixtures("fp32")


@pytest.fixture
def fp32():
    with config.patch(matmul_precision="highest"):
        yield


def test_none_outputs_in_backward():
    # The gradient of an input that does not require grad is None in the backward graph.
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(3, 4)
    f = compile_tpu(lambda x, w: (x @ w).tanh().sum())
    f(x, w).backward()
    w_ref = w.detach().clone().requires_grad_()
    (x @ w_ref).tanh().sum().backward()
    torch.testing.assert_close(w.grad, w_ref.grad)


def test_outputs_that_alias_inputs_and_duplicates():
    def f(x, y):
        z = x * 2
        return x, z, z, y.view(-1), y
    x, y = torch.randn(3), torch.randn(2, 2)
    out = compile_tpu(f)(x, y)
    ref = f(x, y)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b)
    assert out[0] is x or out[0].data_ptr() == x.data_ptr()
    assert out[3].data_ptr() == y.data_ptr()  # a view of the input stays a view
    out[1].add_(1)  # duplicate outputs are one tensor, as in eager
    assert torch.equal(out[1], out[2])


def test_batchnorm_running_stats_mutated_in_place():
    bn = torch.nn.BatchNorm1d(5)
    ref = copy.deepcopy(bn)
    x = torch.randn(8, 5)
    compiled = compile_tpu(bn)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), ref(x))
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    assert bn.num_batches_tracked.item() == ref.num_batches_tracked.item() == 3


def test_compiled_optimizer_step_mutates_state():
    torch.manual_seed(0)
    torchtpu_compile.reset_stats()
    model = torch.nn.Linear(6, 3)
    ref = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.1)
    step = compile_tpu(opt.step)
    x = torch.randn(4, 6)
    for _ in range(3):
        for m, o, s in ((model, opt, step), (ref, ref_opt, ref_opt.step)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            s()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)
        torch.testing.assert_close(opt.state[p]["exp_avg_sq"], ref_opt.state[q]["exp_avg_sq"])
    assert torchtpu_compile.stats()["graphs_compiled"] + torchtpu_compile.stats()["cache_hits"] > 0
    # Adam's addcmul_(..., value=) reaches us as inductor's prims.fma: lowered, not cut out.
    assert torchtpu_compile.stats()["fallback_ops"] == {}


def test_scalar_and_symint_inputs():
    def f(x, scale, n):
        return x[:n] * scale + n
    compiled = compile_tpu(f)
    for scale, n in ((2.5, 3), (0.5, 5), (1.5, 2)):  # the second call makes them dynamic
        x = torch.randn(6, 2)
        torch.testing.assert_close(compiled(x, scale, n), f(x, scale, n))


def test_dynamic_shapes_are_specialized_per_call():
    compiled = compile_tpu(lambda x: x.softmax(-1) * x.shape[0], dynamic=True)
    for rows in (3, 5, 9):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(compiled(x), x.softmax(-1) * rows)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.bfloat16,
                                   torch.float16])
def test_dtypes_round_trip(dtype):
    def f(x, idx):
        return x * 2, idx + 1, (idx > 2), x[idx]
    x = (torch.randn(8) * 10).to(dtype) if dtype.is_floating_point else torch.arange(8).to(dtype)
    idx = torch.tensor([1, 3, 7], dtype=torch.int64)
    out = compile_tpu(f)(x, idx)
    ref = f(x, idx)
    for a, b in zip(out, ref):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)


def test_int64_is_not_narrowed():
    big = torch.tensor([2 ** 40, -(2 ** 40) - 3], dtype=torch.int64)
    out = compile_tpu(lambda t: t * 3 + 1)(big)
    assert out.dtype == torch.int64
    assert torch.equal(out, big * 3 + 1)


def test_dropout_distribution_and_seed():
    drop = torch.nn.Dropout(0.3).train()
    compiled = compile_tpu(lambda x: drop(x))
    x = torch.ones(20000)
    torch.manual_seed(7)
    a = compiled(x)
    torch.manual_seed(7)
    b = compiled(x)
    c = compiled(x)
    assert torch.equal(a, b), "same seed, same mask"
    assert not torch.equal(b, c), "the generator advances between calls"
    kept = (a != 0).float().mean().item()
    assert abs(kept - 0.7) < 0.02
    torch.testing.assert_close(a[a != 0], torch.full_like(a[a != 0], 1 / 0.7))


def test_dropout_follows_torch_rng_not_its_own():
    drop = torch.nn.Dropout(0.5).train()
    compiled = compile_tpu(lambda x: drop(x))
    torch.manual_seed(1)
    a = compiled(torch.ones(64))
    torch.manual_seed(2)
    b = compiled(torch.ones(64))
    assert not torch.equal(a, b)


def test_graph_with_no_outputs():
    def f(x):
        x.add_(1)  # only a mutation: the compiled graph returns nothing of its own
    x = torch.zeros(3)
    assert compile_tpu(f)(x) is None
    assert torch.equal(x, torch.ones(3))


def test_function_returning_none():
    compiled = compile_tpu(lambda x: None)
    assert compiled(torch.ones(2)) is None


def test_uninitialized_outputs_compile():
    # torch.empty reaching an output lowered to tensor.empty, which XLA rejects.
    out = compile_tpu(lambda x: (torch.empty_like(x), x + 1))(torch.ones(3, 4))
    assert out[0].shape == (3, 4) and torch.equal(out[1], torch.full((3, 4), 2.0))


def test_outputs_with_no_elements_are_made_outside_the_program():
    # torch-mlir cannot express a 0-element literal (batch norm's uint8 reserve): such outputs
    # are made by the caller, with the traced dtype and shape, on each path.
    def f(x, w, b, mean, var):
        mean, var = mean.clone(), var.clone()
        out = torch.ops.aten._batch_norm_with_update(x, w, b, mean, var, 0.1, 1e-5)
        return (*out, mean, var, x.new_zeros((2, 0)), torch.full_like(x[:, :0], 3.0))
    x = torch.randn(4, 3, 5)
    args = (x, torch.rand(3) + 0.5, torch.randn(3), torch.randn(3), torch.rand(3) + 0.5)
    expected = f(*args)
    torchtpu_compile.reset_stats()
    with config.patch(strict=True):
        compiled = compile_tpu(f)(*args)
        on_tpu = f(*(a.to("tpu") for a in args))
    for actual in (compiled, [t.cpu() for t in on_tpu]):
        for a, e in zip(actual, expected):
            assert a.dtype == e.dtype and a.shape == e.shape
            torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-4)
    assert compiled[3].device.type == "cpu" and on_tpu[3].device.type == "tpu"
    assert torchtpu_compile.stats()["eager_fallbacks"] == 0


def _laid_out(t):
    # what code after a compiled call can see of a tensor's layout
    return t.shape, t.stride(), t.is_contiguous(), \
        t.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("on_tpu", [False, True], ids=["host", "tpu"])
def test_channels_last_convolutions_keep_eagers_layout(on_tpu):
    # Eager's convolutions of channels-last inputs are channels-last; compiled, the fake
    # convolution on the tpu device (and a transposed one on the host, traced with mkldnn
    # off) came out contiguous, and so did the ops after it: ConvNeXt-style
    # y.permute(0, 2, 3, 1).view(-1, C) after the call raised where eager returns. (Inside a
    # compiled function on tpu tensors it still raises: Dynamo's own fake convolution.)
    torch.manual_seed(0)
    device = "tpu" if on_tpu else "cpu"
    conv = torch.nn.Conv2d(4, 4, 3, padding=1).to(device, memory_format=torch.channels_last)
    up = torch.nn.ConvTranspose2d(4, 2, 2, 2).to(device, memory_format=torch.channels_last)

    def f(x):
        y = conv(x).relu() + x
        return y, up(y)

    image = torch.randn(2, 4, 6, 10).contiguous(memory_format=torch.channels_last)
    want = [w.cpu() for w in f(image.to(device))]
    got = compile_tpu(f)(image.to(device))
    for g, w in zip(got, want):
        assert g.device.type == device
        assert _laid_out(g) == _laid_out(w)
        torch.testing.assert_close(g.cpu(), w, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[0].permute(0, 2, 3, 1).view(-1, 4).cpu(),
                               want[0].permute(0, 2, 3, 1).view(-1, 4))


@pytest.mark.parametrize("on_tpu", [False, True], ids=["host", "tpu"])
def test_outputs_have_eagers_strides(on_tpu):
    # Eager keeps an elementwise op's input layout (x.t() * 2 has strides (1, 4)); compiled
    # results were always contiguous, so code after the call that views them as eager laid them
    # out (y.t().view(-1)) raised, and stride()/is_contiguous() differed from eager's and
    # Inductor's. Outputs are not views (in-place on them works, as in eager).
    # (A channels-last conv on the host only: the tpu device makes every tensor it creates
    # contiguous, its inputs' copies included.)
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    image = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)

    def f(x, z, image):
        y = x.t() * 2
        return y, z.permute(0, 2, 3, 1).relu(), y, x + 1, *([] if on_tpu else [conv(image)])

    args = (torch.randn(3, 4), torch.randn(2, 3, 4, 5), image)
    want = f(*args)
    got = compile_tpu(f)(*[a.to("tpu") for a in args] if on_tpu else args)
    for g, w in zip(got, want):
        assert _laid_out(g) == _laid_out(w)
        assert g._base is None
        torch.testing.assert_close(g.cpu(), w, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[0].t().view(-1).cpu(), want[0].t().view(-1))
    torch.testing.assert_close(got[0].add_(1).cpu(), want[0] + 1)


def test_training_outputs_have_eagers_strides():
    w = torch.randn(3, 4, requires_grad=True)
    f = lambda w: (w.t() * 3).sin()  # noqa: E731
    got = compile_tpu(f)(w)
    want = f(w)
    assert _laid_out(got) == _laid_out(want)
    (g,) = torch.autograd.grad(got.sum(), w)
    torch.testing.assert_close(g, torch.autograd.grad(want.sum(), w)[0])


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_view_of_a_written_transposed_input_reads_its_elements(dynamic, fresh_dynamo):
    # Fuzz seed 1614: the graph returns the input's new value and a view of it; aot_autograd
    # rebuilds the view from the input's memory with the strides of the base the graph
    # returned. That base came back contiguous while the input is transposed (eager keeps
    # its layout), so the view read other elements: one element wrong, no error.
    def fn(x):
        v = x[x.shape[0] // 2:]
        v[v > 0] = -1
        return v * 1, v

    compiled = torch.compile(fn, backend="torchtpu", dynamic=dynamic)
    for n in (3, 5):
        base = torch.arange(n * 4).reshape(4, n) % 3 - 1
        x, expected_x = base.clone().t(), base.clone().t()
        expected = fn(expected_x)
        actual = compiled(x)
        assert torch.equal(x, expected_x)
        for a, e in zip(actual, expected):
            assert torch.equal(a, e) and a.stride() == e.stride()
