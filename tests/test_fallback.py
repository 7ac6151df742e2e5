"""Ops that do not lower run in eager PyTorch, counted and named; strict mode makes it an error."""
import logging

import pytest
import torch

import torchtpu_compile
from tests.support.helpers import compile_tpu
from torchtpu_compile import _logging, config
from torchtpu_compile.errors import UnsupportedOpError


@torch.library.custom_op("torchtpu_test::scaled_sigmoid", mutates_args=())
def scaled_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """An op the FX importer has never heard of: it cannot lower, whatever torch-mlir learns."""
    return torch.sigmoid(x) * 2


@scaled_sigmoid.register_fake
def _(x):
    return torch.empty_like(x)


def _scaled_sigmoid_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    s = torch.sigmoid(x)
    return grad * 2 * s * (1 - s)


scaled_sigmoid.register_autograd(
    _scaled_sigmoid_backward, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(
        inputs[0]))

UNLOWERABLE = "torchtpu_test.scaled_sigmoid.default"


class UnlowerableNet(torch.nn.Module):
    """A linear layer, an op that does not lower, and more lowerable ops after it."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 4)

    def forward(self, x):
        y = torch.relu(self.linear(x * 2))
        return scaled_sigmoid(y) + 1  # the op to blame is on this line


@torch.library.custom_op("torchtpu_test::column_sums", mutates_args=())
def column_sums(x: torch.Tensor) -> torch.Tensor:
    """Unlowerable, and its fake kernel promises float32 where the real one keeps the input's
    dtype: as PyTorch's bf16 batch norm does for its running statistics."""
    return x.sum(0) * 1


@column_sums.register_fake
def _(x):
    return x.new_empty(x.shape[1:], dtype=torch.float32)


@torch.library.custom_op("torchtpu_test::doubled", mutates_args=(), tags=(torch.Tag.pointwise,))
def doubled(x: torch.Tensor) -> torch.Tensor:
    """Unlowerable but pointwise: a bucketed graph pads through it and cuts at it."""
    return x * 2


@doubled.register_fake
def _(x):
    return torch.empty_like(x)


@pytest.fixture(autouse=True)
def fresh_stats(monkeypatch):
    torchtpu_compile.reset_stats()
    # warned-once keys are per process: an earlier test's fallback of the same op would have
    # used up the warning these tests look for
    monkeypatch.setattr(_logging, "_warned", set())
    with config.patch(matmul_precision="highest"):
        yield


def test_unlowerable_op_falls_back_and_the_rest_still_compiles(caplog):
    model = UnlowerableNet()
    x = torch.randn(2, 6)
    with caplog.at_level(logging.WARNING, logger="torchtpu"):
        out = compile_tpu(model)(x)
        torch.testing.assert_close(out, model(x))
        compile_tpu(model)(x)  # a second graph with the same op does not warn again
    stats = torchtpu_compile.stats()
    # counted once per program built, cold or warm: an entry the Dynamo cache refused after
    # loading its graph (the global's name taken after torch._dynamo.reset()) built it twice
    assert stats["fallback_ops"] == {UNLOWERABLE: 2}
    assert stats["graphs_with_fallback"] == 2
    # The regions before and after the conv ran through XLA (compiled here or cached).
    assert stats["graphs_compiled"] + stats["cache_hits"] >= 2
    warnings = [r.getMessage() for r in caplog.records if "eager PyTorch" in r.getMessage()]
    assert len(warnings) == 1
    assert UNLOWERABLE in warnings[0]


def test_fallback_in_training_matches_eager():
    model = UnlowerableNet()
    ref = UnlowerableNet()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 6)
    compile_tpu(model)(x).pow(2).mean().backward()
    ref(x).pow(2).mean().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)


def test_strict_mode_names_op_shapes_dtypes_and_source_line():
    with config.patch(strict=True), pytest.raises(Exception) as info:
        compile_tpu(UnlowerableNet())(torch.randn(2, 6))
    error = info.value  # Dynamo wraps backend errors in BackendCompilerFailed
    error = getattr(error, "inner_exception", error)
    assert isinstance(error, UnsupportedOpError), info.value
    message = str(error)
    assert UNLOWERABLE in message
    assert "float32[2, 4]" in message
    assert "test_fallback.py:" in message and "the op to blame is on this line" in message
    assert "module {" not in message  # an explanation, not an MLIR dump


def test_lowering_failure_message_is_a_summary():
    from torch.fx.experimental.proxy_tensor import make_fx
    from torchtpu_compile.errors import LoweringError
    from torchtpu_compile.lower import lower_graph
    gm = make_fx(lambda x: torch.masked_select(x, x > 0), tracing_mode="fake")(torch.randn(4))
    with pytest.raises(LoweringError) as info:
        lower_graph(gm, platform="cpu", precision="highest")
    message = str(info.value)
    assert "masked_select" in message
    assert len(message.splitlines()) <= 2


def test_a_lowering_failure_without_a_message_is_named(monkeypatch):
    # torch-mlir's own asserts carry no message: the fallback warning said "unknown error"
    # (an EmbeddingBag's sparse gradient).
    from torch.fx.experimental.proxy_tensor import make_fx
    from torchtpu_compile.errors import LoweringError
    from torchtpu_compile.lower import importer

    def failing(gm):
        raise AssertionError()
    monkeypatch.setattr(importer, "_fx_to_stablehlo", failing)
    gm = make_fx(lambda x: x + 1, tracing_mode="fake")(torch.randn(4))
    with pytest.raises(LoweringError, match="importer raised AssertionError with no message"):
        importer.import_stablehlo(gm)


def test_region_after_a_fallback_gets_the_dtype_it_was_traced_with():
    # The region after the fallback was lowered for the traced float32 but handed the bf16
    # the op really returned: XLA refused the buffer (bf16 BatchNorm training fell back so).
    x = torch.randn(6, 5).to(torch.bfloat16)

    def fn(x):
        return torch.exp(column_sums(x * 2)) + 1

    out = compile_tpu(fn)(x)
    assert UNLOWERABLE.replace("scaled_sigmoid", "column_sums") in torchtpu_compile.stats()[
        "fallback_ops"]
    torch.testing.assert_close(out.float(), fn(x).float(), rtol=2e-2, atol=0)


def test_fallback_op_that_conjugates_inside_matches_eager_on_the_first_call():
    # linalg.pinv of a complex matrix takes U.mH inside its CPU kernel. Run from inside a
    # dispatch handler (the tpu device's host fallback; aot_autograd's mode around every
    # compiled function's first call), PyTorch excluded the Conjugate key, and the kernel's
    # next op ignored the conjugate bit: a wrong result, no error.
    a = torch.complex(torch.randn(4, 3), torch.randn(4, 3))
    expected = torch.linalg.pinv(a)
    torch.testing.assert_close(compile_tpu(torch.linalg.pinv)(a), expected)
    torch.testing.assert_close(torch.linalg.pinv(a.to("tpu")).cpu(), expected)


def test_a_fallback_in_a_bucketed_graph_runs():
    # A bucket's program with a fallback region raised TypeError (it was handed the result
    # device that every other program takes).
    fn = lambda x: doubled(x.exp()) + 1  # noqa: E731
    compiled = compile_tpu(fn, dynamic=True)
    for n in (3, 5):
        x = torch.randn(2, n)
        torch.testing.assert_close(compiled(x), fn(x))
    stats = torchtpu_compile.stats()
    assert stats["fallback_ops"] == {"torchtpu_test.doubled.default": 1}
    assert stats["buckets"]["exact_shape_compiles"] == 0


@pytest.mark.parametrize("fn", [
    lambda x: x + x.argmax().item(),
    lambda x: x * x.sum().item(),
    lambda x: torch.arange(3)[x.argmax() % 3].item() + x,
], ids=["int_item", "float_item", "indexed_item"])
def test_item_captured_in_the_graph_with_a_region_returning_one_value(fn):
    # With capture_scalar_outputs (a common Dynamo setting for code that calls .item()), the
    # .item() falls back and the region after it returns a single value: its runner read the
    # region graph's output as a tuple and raised "'Node' object is not iterable".
    torch._dynamo.reset()
    x = torch.randn(3)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        torch.testing.assert_close(compile_tpu(fn)(x), fn(x))


def test_an_lstm_compiled_with_allow_rnn_lowers_whole():
    # aten.lstm's decomposition chose mkldnn_rnn_layer for CPU tensors (no grad needed by the
    # input, mkldnn on), which does not lower: the layer ran on the host, a fallback per layer.
    torch.manual_seed(0)
    lstm, x = torch.nn.LSTM(4, 5, 2), torch.randn(3, 2, 4)
    with torch._dynamo.config.patch(allow_rnn=True), config.patch(strict=True), \
            torch.no_grad():
        out, (h, c) = compile_tpu(lstm)(x)
        ref, (rh, rc) = lstm(x)
    for got, want in ((out, ref), (h, rh), (c, rc)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)



def test_a_roll_beside_a_fallback_op_keeps_its_positions():
    # all.dims fails in torch-mlir only once the whole graph is lowered, so the graph is cut
    # after the rewrites (fx_passes.normalize) ran and each piece is normalized again: there
    # the roll's remainder, which stands for XLA's C fmod, was folded on the host as eager's
    # remainder. Its sign test came out false, position -1 was clamped to row 0 and both rows
    # were x[0], silently (fuzz seed 4208). dynamic=True: a graph of symbolic sizes is
    # specialized to the call's, and its roll positions stay expressions until then.
    x = torch.tensor([[5.0, 1.0, 5.0], [-9.0, 1.0, 4.0]])

    def f(t):
        return t.all(dim=(-2, -1), keepdim=True), t.clone().copy_(t.roll(1, 0))
    torch.testing.assert_close(compile_tpu(f, dynamic=True)(x), f(x))


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_a_graph_setting_an_inputs_data_runs_in_eager_as_eager_does(training):
    # `m.weight.data = ...` inside a compiled function is a set_ of a graph input, which
    # aot_autograd refuses to keep in a program ("Encountered a set_ on a graph input"): the
    # compile raised where eager returns. The graph runs in eager PyTorch now, counted.
    def step(model, x):
        model.weight.data = model.weight.data * 0.5
        return model(x).sum()

    torch.manual_seed(0)
    ours, ref = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 4)
    compiled = compile_tpu(lambda x: step(ours, x))
    with torch.set_grad_enabled(training), config.patch(strict=False):
        got, want = compiled(x), step(ref, x)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(ours.weight, ref.weight)
        if training:
            got.backward()
            want.backward()
            torch.testing.assert_close(ours.weight.grad, ref.weight.grad)
    assert torchtpu_compile.stats()["fallback_ops"].get("aten.set_", 0) >= 1
    with config.patch(strict=True), pytest.raises(Exception) as info:
        torch._dynamo.reset()
        compile_tpu(lambda x: step(ours, x))(x)
    error = getattr(info.value, "inner_exception", info.value)  # in BackendCompilerFailed
    assert isinstance(error, UnsupportedOpError) and "p.data = " in str(error), info.value


def _poisson_then_randn(rate):
    k = torch.poisson(rate * 3)  # its rate is computed by the graph: the op falls back
    return k, torch.randn(8) * rate


def _rand_randn_around_a_fallback(x):
    first = torch.rand(8)
    second = torch.randn(8)
    return first + doubled(second * 2 + x)


@pytest.mark.parametrize("fn", [_poisson_then_randn, _rand_randn_around_a_fallback],
                         ids=["random_fallback", "fallback_between_draws"])
def test_random_numbers_around_a_fallback_are_drawn_in_eager_order(fn):
    # The partitioner merged independent nodes across the fallback and moved regions, and a
    # region draws when it starts: the randn was drawn before the poisson (and the second
    # draw before the first), each result equal to eager's with the draws swapped.
    x = torch.rand(8) + 0.5
    torch.manual_seed(0)
    expected = fn(x)
    compiled = compile_tpu(fn)
    for _ in range(2):  # the cold call, then the cached program
        torch.manual_seed(0)
        torch.testing.assert_close(compiled(x), expected, rtol=0, atol=0)
