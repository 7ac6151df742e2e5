"""The eager device's per-op fast path (strict mode): one lookup and one execute per op, with
the same values, memory figures and mode behaviour as the general path."""
import sys

import torch

import torchtpu_compile
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


def test_in_place_and_matmul_ops_take_the_fast_path():
    # 25 and 27 Python calls before: an in-place add and a matmul took the general path.
    torch.tpu.set_eager_mode("strict")
    x, w = torch.randn(64).to(TPU), torch.randn(8, 8).to(TPU)
    with torchtpu_compile.config.patch(matmul_precision="highest"):
        assert _python_calls(lambda: x.add_(1.0)) <= 16
        assert _python_calls(lambda: w @ w) <= 20


def test_fast_in_place_and_multi_output_values_match_cpu():
    torch.tpu.set_eager_mode("strict")
    host = torch.randn(2, 3)
    x = host.to(TPU)
    alias = x.view(6)
    for _ in range(3):  # planned on the first, fast on the next
        out = x.mul_(2.0)
        assert out is x
        host.mul_(2.0)
    x[0].add_(1.0)  # a view as the written tensor: through the storage, like any write
    host[0].add_(1.0)
    torch.testing.assert_close(alias.cpu(), host.view(6))
    for _ in range(3):
        values, indices = torch.max(x, dim=1)
    expected = torch.max(host, dim=1)
    torch.testing.assert_close(values.cpu(), expected.values)
    torch.testing.assert_close(indices.cpu(), expected.indices)
    assert values.shape == (2,) and indices.dtype == torch.int64


def test_fast_matmul_follows_the_matmul_precision():
    # The program of a matmul depends on the precision: a plan made under one must not run
    # under another (medium rounds the operands to bf16 on every platform).
    torch.tpu.set_eager_mode("strict")
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    at, bt = a.to(TPU), b.to(TPU)
    errors = []
    for precision in ("highest", "highest", "medium", "medium", "highest"):
        with torchtpu_compile.config.patch(matmul_precision=precision):
            errors.append(((at @ bt).cpu() - a @ b).abs().max().item())
    assert max(errors[0], errors[1], errors[4]) < 1e-4
    assert min(errors[2], errors[3]) > 1e-3


def test_views_from_the_geometry_cache_match_cpu():
    # A view's geometry is decided once per call key: the second call of each takes it from
    # the cache, with one or several results, over the base's storage. (Geometry only: the
    # values of a view are read through its storage as before, test_eager_device.)
    host = torch.randn(4, 6)
    x = host.to(TPU)
    for _ in range(2):
        for view in (lambda t: t.split(2, dim=1), lambda t: t.unbind(0),
                     lambda t: t.t()[1:3], lambda t: t[:, 2], lambda t: t.expand(2, 4, 6),
                     lambda t: t.detach()):
            got, want = view(x), view(host)
            assert isinstance(got, tuple) == isinstance(want, tuple)
            for g, w in zip(got, want) if isinstance(want, tuple) else [(got, want)]:
                assert (g.shape, g.stride(), g.storage_offset()) == \
                    (w.shape, w.stride(), w.storage_offset())
                assert g._st is x._st


def test_dead_storages_leave_the_live_set():
    # Storages are tracked without a death callback (one Python call less per op): dead
    # references must still be swept, or the set grows with every op ever run.
    from torchtpu_eager import storage
    kept = storage.Storage(None, (1,), torch.float32, 1)
    for _ in range(20000):
        storage.Storage(None, (1,), torch.float32, 1)
    assert len(storage._live) < 10000
    live = storage.live_storages()
    assert any(s is kept for s in live) and len(storage._live) == len(live)


def _executions(fn) -> int:
    """Programs run by ``fn()`` (torch.profiler's ``torchtpu::execute`` events)."""
    fn()
    with torch.profiler.profile() as prof:
        fn()
    return sum(1 for e in prof.events() if e.name == "torchtpu::execute")


def test_an_op_reads_its_transposed_inputs_in_its_own_program():
    # F.linear reads w.t(): the read was a program of its own, whose whole transposed weight
    # was written out only for the matmul to read it.
    torch.tpu.set_eager_mode("strict")
    torch.manual_seed(0)
    x, w, b = torch.randn(6, 5), torch.randn(4, 5), torch.randn(4)
    xt, wt, bt = x.to(TPU), w.to(TPU), b.to(TPU)
    with torchtpu_compile.config.patch(matmul_precision="highest"):
        assert _executions(lambda: torch.nn.functional.linear(xt, wt, bt)) == 1
        torch.testing.assert_close(torch.nn.functional.linear(xt, wt, bt).cpu(),
                                   torch.nn.functional.linear(x, w, b))
        # a permuted 3-d view and a broadcast one, and a slice (a gather) in one op
        p, q, r = torch.randn(2, 3, 4), torch.randn(4, 3), torch.randn(6, 3, 4)

        def op(p, q, r):
            return torch.addcmul(p.permute(2, 1, 0), q[:, :, None].expand(4, 3, 2),
                                 r[1:5, :, ::2])
        pt, qt, rt = p.to(TPU), q.to(TPU), r.to(TPU)
        assert _executions(lambda: op(pt, qt, rt)) == 1
        torch.testing.assert_close(op(pt, qt, rt).cpu(), op(p, q, r))


def test_a_folded_read_leaves_the_fast_path_to_dense_calls():
    torch.tpu.set_eager_mode("strict")
    a, c = torch.randn(3, 4).to(TPU), torch.randn(4, 5).to(TPU)
    b = torch.randn(5, 4).to(TPU)
    torch.mm(a, b.t())      # the same signature as mm(a, c), its first run folded
    torch.mm(a, c)
    assert _python_calls(lambda: torch.mm(a, c)) <= 18


def test_an_op_with_zero_and_then_negative_zero_runs_each_ones_program():
    # 0.0 == -0.0 and both hash alike: the op cache ran the program compiled for -0.0 for
    # x.div(0.0, rounding_mode="floor"), every infinity of the wrong sign, no error (fuzz seed
    # 3588)
    x = torch.tensor([1.0, -2.0, 3.0])
    for divisor in (-0.0, 0.0, -0.0):
        got = x.to("tpu").div(divisor, rounding_mode="floor").cpu()
        torch.testing.assert_close(got, x.div(divisor, rounding_mode="floor"))
