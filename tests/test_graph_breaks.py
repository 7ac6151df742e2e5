"""Strict mode means nothing ran outside XLA without an error, whether Dynamo broke the graph
or not; without strict, graph breaks are counted and named like fallbacks."""
import logging
import os
import subprocess
import sys

import pytest
import torch

import torchtpu_compile
from tests.support.helpers import compile_tpu
from torchtpu_compile import config
from torchtpu_compile.errors import UnsupportedOpError

MASKED_SELECT_REASON = "Dynamic shape operator"


def select_positive(x, ran):
    y = x * 2
    ran.append("host")  # runs only when the compiled frame runs
    picked = torch.masked_select(y, y > 2)  # the graph breaks here
    return picked.sum()


@pytest.fixture(autouse=True)
def fresh_stats():
    torchtpu_compile.reset_stats()
    yield


def test_graph_break_is_counted_and_warned_once(caplog):
    x = torch.arange(6.0)
    with caplog.at_level(logging.WARNING, logger="torchtpu"):
        compiled = compile_tpu(select_positive)
        for _ in range(2):
            torch.testing.assert_close(compiled(x, []), select_positive(x, []))
    breaks = torchtpu_compile.stats()["graph_breaks"]
    [(reason, count)] = breaks.items()
    assert reason.startswith(MASKED_SELECT_REASON) and "aten.masked_select" in reason
    assert count == 1  # traced once; the second call runs the cached frame
    warnings = [r.getMessage() for r in caplog.records if "breaks the graph" in r.getMessage()]
    assert len(warnings) == 1
    assert "test_graph_breaks.py:" in warnings[0] and "the graph breaks here" in warnings[0]


library_logger = logging.getLogger("some_library")


def log_between(x):
    y = x * 2
    library_logger.warning("a library logs mid-forward")  # the graph breaks here
    return y + 1


def test_graph_break_at_a_logging_call_is_counted_not_warned(caplog):
    # Hugging Face models call logger.warning_once inside forward(); the code at that break is
    # the logging call, so a warning from us there is noise.
    x = torch.arange(6.0)
    with caplog.at_level(logging.INFO, logger="torchtpu"):
        torch.testing.assert_close(compile_tpu(log_between)(x), log_between(x))
    [reason] = torchtpu_compile.stats()["graph_breaks"]
    assert reason.startswith("logging.Logger method")
    ours = [r for r in caplog.records if "breaks the graph" in r.getMessage()]
    assert [r.levelno for r in ours] == [logging.INFO]


def test_strict_graph_break_is_an_error_before_anything_runs():
    ran = []
    with config.patch(strict=True), pytest.raises(UnsupportedOpError) as info:
        compile_tpu(select_positive)(torch.arange(6.0), ran)
    message = str(info.value)
    assert "TORCHTPU_STRICT=1" in message and "aten.masked_select" in message
    assert "test_graph_breaks.py:" in message and "the graph breaks here" in message
    assert ran == []  # raised while tracing: neither graph nor the host code ran
    assert torchtpu_compile.stats()["graph_breaks"] == {}


@pytest.mark.parametrize("code", ["x.sum().item()", "print('side effect') or x"])
def test_strict_catches_other_graph_breaks(code):
    fn = eval(f"lambda x: ({code}) * 2")
    with config.patch(strict=True), pytest.raises(UnsupportedOpError, match="breaks the graph"):
        compile_tpu(fn)(torch.ones(3))


def test_graph_breaks_of_other_backends_are_not_ours():
    torch._dynamo.reset()
    with config.patch(strict=True):
        out = torch.compile(select_positive, backend="eager")(torch.arange(6.0), [])
    torch.testing.assert_close(out, select_positive(torch.arange(6.0), []))
    assert torchtpu_compile.stats()["graph_breaks"] == {}


@pytest.fixture
def capture_dynamic_shapes():
    config = torch._dynamo.config
    saved = config.capture_dynamic_output_shape_ops
    config.capture_dynamic_output_shape_ops = True
    yield
    config.capture_dynamic_output_shape_ops = saved


def test_captured_data_dependent_op_is_a_counted_fallback(capture_dynamic_shapes):
    x = torch.arange(6.0)
    out = compile_tpu(select_positive)(x, [])
    torch.testing.assert_close(out, select_positive(x, []))
    stats = torchtpu_compile.stats()
    assert stats["graph_breaks"] == {}  # one graph: the op is in it, and falls back
    assert stats["fallback_ops"].get("aten.masked_select.default") == 1


def test_captured_data_dependent_op_is_a_strict_error(capture_dynamic_shapes):
    with config.patch(strict=True), pytest.raises(Exception) as info:
        compile_tpu(select_positive)(torch.arange(6.0), [])
    error = getattr(info.value, "inner_exception", info.value)  # Dynamo wraps backend errors
    assert isinstance(error, UnsupportedOpError)
    assert "TORCHTPU_STRICT=1" in str(error) and "aten.masked_select" in str(error)


def test_eager_device_host_fallback_is_a_strict_error():
    x = torch.arange(6.0).to("tpu")
    with config.patch(strict=True), pytest.raises(
            UnsupportedOpError,
            match="aten.masked_select.*TORCHTPU_STRICT|TORCHTPU_STRICT.*aten.masked_select"):
        torch.masked_select(x, x > 2)


def test_strict_from_the_environment_covers_graph_breaks_fallbacks_and_the_eager_device(tmp_path):
    # One child process for the three places TORCHTPU_STRICT=1 reaches.
    script = tmp_path / "strict_breaks.py"
    script.write_text(
        "import torch\n"
        "from torchtpu_compile.errors import UnsupportedOpError\n"
        "f = torch.compile(lambda x: torch.masked_select(x, x > 0).sum(), backend='torchtpu')\n"
        "try:\n"
        "    f(torch.tensor([0.0, 1.0, 2.0]))\n"
        "    print('graph break: no error')\n"
        "except UnsupportedOpError as e:\n"
        "    print('graph break:', 'TORCHTPU_STRICT=1' in str(e))\n"
        "x = torch.tensor([0.0, 1.0, 2.0], device='tpu')\n"
        "try:\n"
        "    x.masked_select(x > 0)\n"
        "    print('eager fallback: no error')\n"
        "except UnsupportedOpError as e:\n"
        "    print('eager fallback:', 'TORCHTPU_STRICT=1' in str(e))\n"
        # an op inside a compiled graph that would fall back (test_fallback's case)
        "torch._dynamo.config.capture_dynamic_output_shape_ops = True\n"
        "g = torch.compile(lambda x: torch.nonzero(x).float().sum(), backend='torchtpu')\n"
        "try:\n"
        "    g(torch.tensor([0.0, 1.0, 2.0]))\n"
        "    print('graph fallback: no error')\n"
        "except Exception as e:\n"
        "    print('graph fallback:', 'TORCHTPU_STRICT=1' in str(e)\n"
        "          and 'aten.nonzero.default' in str(e))\n")
    env = dict(os.environ, TORCHTPU_STRICT="1")
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "graph break: True" in result.stdout, result.stdout
    assert "eager fallback: True" in result.stdout, result.stdout
    assert "graph fallback: True" in result.stdout, result.stdout


def test_strict_allows_autograd_breaks_whose_backward_is_compiled():
    # The code at this break is the autograd engine running the backward graph we compiled.
    def grad_of_square(x):
        return torch.autograd.grad((x * x).sum(), x)[0]
    x = torch.randn(5, requires_grad=True)
    with config.patch(strict=True):
        torch.testing.assert_close(compile_tpu(grad_of_square)(x), 2 * x.detach())
    [reason] = torchtpu_compile.stats()["graph_breaks"]
    assert "torch.autograd.grad" in reason
    assert not torchtpu_compile.stats()["fallback_ops"]


def test_a_buffer_dying_under_a_compiled_frame_is_no_graph_break():
    # A PJRT buffer's finalizer (runtime/memory.py) runs wherever the buffer dies; here in the
    # side effects Dynamo replays after the graph, where it intercepts every new frame. It
    # tried to trace the finalizer and broke at its lock (a graph break counted and warned).
    import torchtpu_eager  # noqa: F401  (registers the device; autoload does too)

    def f(x, holder):
        holder.clear()  # the only reference to a tpu tensor: its buffer dies in the replay
        return x + 1

    holder = [torch.ones(3, device="tpu") * 2]
    x = torch.ones(3, device="tpu")
    before = dict(torchtpu_compile.stats()["graph_breaks"])
    got = torch.compile(f, backend="torchtpu")(x, holder)
    assert holder == [] and torch.equal(got.cpu(), torch.full((3,), 2.0))
    assert dict(torchtpu_compile.stats()["graph_breaks"]) == before
