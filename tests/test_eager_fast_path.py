"""The eager device's per-op fast path (strict mode): one lookup and one execute per op, with
the same values, memory figures and mode behaviour as the general path."""
import sys

import torch

import torchtpu_eager  # noqa: F401
from torchtpu_eager import dispatch

TPU = torch.device("tpu", 0)


def _python_calls(fn, calls: int = 10) -> float:
    fn()
    fn()
    count = [0]

    def profile(frame, event, arg):
        if event == "call":
            count[0] += 1
    sys.setprofile(profile)
    try:
        for _ in range(calls):
            fn()
    finally:
        sys.setprofile(None)
    return count[0] / calls


def test_strict_add_is_one_lookup_and_one_execute():
    # 32 Python calls per add before the fast path (dispatch, mode, graph, program, tensor
    # layers); PyTorch's own rule lookup and the buffers' death callbacks are part of the rest.
    x = torch.randn(64).to(TPU)
    torch.tpu.set_eager_mode("strict")
    assert _python_calls(lambda: x + 1) <= 16


def test_fast_path_values_and_memory_match_the_general_path():
    torch.tpu.set_eager_mode("strict")
    host = torch.randn(5, 7)
    x = host.to(TPU)
    for _ in range(3):  # the first run decides the plan, the next ones take it
        y = (x * 2.0).add(1.5).relu()
    torch.testing.assert_close(y.cpu(), (host * 2.0).add(1.5).relu())
    assert y.shape == (5, 7) and y.stride() == (7, 1) and y.device == TPU
    assert y.is_contiguous() and y.storage_offset() == 0
    y.add_(1.0)  # a write to a fast-path result goes through its storage like any other
    torch.testing.assert_close(y.cpu(), (host * 2.0).add(1.5).relu() + 1.0)
    before = torch.tpu.memory_allocated()
    z = x + 1.0
    assert torch.tpu.memory_allocated() == before + 5 * 7 * 4
    del z
    assert torch.tpu.memory_allocated() == before


def test_debug_and_defer_modes_do_not_take_the_fast_path():
    host = torch.randn(8)
    x = host.to(TPU)
    torch.tpu.set_eager_mode("strict")
    x.sin()
    x.sin()  # planned in strict mode
    key, _ = dispatch.signature(torch.ops.aten.sin.default, (x,), {})
    assert dispatch._ops[key].fast
    try:
        torch.tpu.set_eager_mode("defer_and_fuse")
        y = x.sin()
        assert type(y._st.value).__name__ == "Lazy"  # recorded, not run
        torch.tpu.set_eager_mode("strict")
        torch.testing.assert_close((y + 0.0).cpu(), host.sin())
    finally:
        torch.tpu.set_eager_mode("strict")
