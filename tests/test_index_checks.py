"""Indices out of range raise eager's error on every path, instead of being clamped by XLA.

Each indexing op runs with an index out of range on the compile path (CPU tensors: raised
before the call returns), on the eager tpu device (strict: at the next synchronization; debug:
at the op; defer-and-fuse: at the materialization point) and through an AOT artifact. The
error has eager CPU's type and message, and names the op and the line that called it; in-range
indices (negative ones where eager wraps them) give eager's values, and the next correct call
after an error works.
"""
import re

import pytest
import torch
import torch.nn.functional as F

import torchtpu_compile
from tests.support.helpers import compile_tpu
from torchtpu_compile import config

X = torch.arange(8.0).reshape(4, 2)


def _rows(i):
    return i.reshape(-1, 1).expand(-1, 2)


def _ones(x, i):
    return x.new_ones(i.numel(), 2)


def _ints(x, i):
    return x.long()[:i.numel(), 1] - 3


def _setitem(x, i):
    y = x.clone()
    y[i] = 1.0  # the line an error of x[i] = v names
    return y


def _unpool(x, i):
    values = x.reshape(1, 1, 1, 8)[..., :i.numel()]
    return F.max_unpool2d(values, i.reshape(1, 1, 1, -1), (1, 2))  # the line an error names


def _sorted_by(x, i):
    sequence, values = x[:i.numel(), 0].contiguous(), x[:2, 1].contiguous()
    return torch.searchsorted(sequence, values, sorter=i)  # the line an error names


#: The line an error names, for the ops called in a helper above.
HELPER_LINES = {"setitem": "y[i] = 1.0", "max_unpool2d": "F.max_unpool2d(values",
                "searchsorted": "torch.searchsorted(sequence"}

# name -> (fn(x, i), an index out of range, an index in range). Each fn on its own line: the
# error must name it.
OPS = {
    "index": (lambda x, i: x[i] * 1, [1, 5], [0, -1]),
    "index_negative": (lambda x, i: x[i] * 1, [-5], [-4, 3]),
    "index_dim1": (lambda x, i: x[:, i] * 1, [2], [-1, 1]),
    "index_put": (lambda x, i: x.index_put((i,), torch.tensor(7.0)), [4], [-1, 2]),
    "index_put_accumulate": (lambda x, i: x.index_put((i,), torch.tensor(7.0), True), [4], [1, 1]),
    "setitem": (lambda x, i: _setitem(x, i) * 1, [9], [-2]),
    "embedding": (lambda x, i: F.embedding(i, x), [1, 4], [3, 0]),
    "gather": (lambda x, i: torch.gather(x, 0, _rows(i)), [5], [3, 0]),
    "index_select": (lambda x, i: torch.index_select(x, 0, i), [-1], [2, 3]),
    "take": (lambda x, i: torch.take(x, i), [8], [-8, 7]),
    "put": (lambda x, i: x.put(i, x.new_ones(i.shape)), [-9], [-1, 0]),
    "scatter": (lambda x, i: x.scatter(0, _rows(i), 7.0), [4], [0, 3]),
    "scatter_add": (lambda x, i: x.scatter_add(0, _rows(i), _ones(x, i)), [-1], [1, 2]),
    "scatter_reduce": (lambda x, i: x.scatter_reduce(0, _rows(i), _ones(x, i), "sum"), [6], [2]),
    "index_add": (lambda x, i: x.index_add(0, i, _ones(x, i)), [4], [1, 3]),
    # a vector's: IndexError "index out of range in self" (fuzz seed 4875); a matrix's above
    "index_add_vector": (lambda x, i: x[:, 0].index_add(0, i, x.new_ones(i.numel())), [-1],
                         [1, 3]),
    "index_copy": (lambda x, i: x.index_copy(0, i, _ones(x, i)), [7], [2]),
    "index_fill": (lambda x, i: x.index_fill(0, i, 3.0), [4], [-1]),
    "nll_loss": (lambda x, i: F.nll_loss(x[:i.numel()].log_softmax(1), i), [2], [1, -100]),
    # Class targets, unpooling positions and a sorter: gathered by their decompositions,
    # where XLA would clamp them.
    "multi_margin_loss": (lambda x, i: F.multi_margin_loss(x[:i.numel()], i), [1, 2], [1, 0]),
    "multilabel_margin_loss": (lambda x, i: F.multilabel_margin_loss(x[:1], i.reshape(1, -1)),
                               [2, -1], [1, -1]),
    "max_unpool2d": (lambda x, i: _unpool(x, i), [1, 4], [3, 0]),
    "searchsorted": (lambda x, i: _sorted_by(x, i), [0, -1], [1, 0]),
    # Integer division by a zero divisor: eager's CPU kernels raise; XLA returns a value.
    "floor_divide": (lambda x, i: _ints(x, i) // i, [3, 0], [2, -3]),
    "remainder": (lambda x, i: _ints(x, i) % i, [0], [-3, 2]),
    "fmod": (lambda x, i: torch.fmod(_ints(x, i), i), [0, 1], [5, -1]),
    "div_trunc": (lambda x, i: torch.div(_ints(x, i), i, rounding_mode="trunc"), [0], [-2, 3]),
    # Values, not indices, that eager's kernels refuse: XLA computed NaN, or a loss, from a
    # probability outside [0, 1], and filled a mask's extra places with the source's last value.
    "bce_input": (lambda x, i: F.binary_cross_entropy(i / 4, x[:i.numel(), 0] / 8), [1, 5], [0, 3]),
    "bce_target": (lambda x, i: F.binary_cross_entropy(x[:i.numel(), 1] / 8, i / 1), [0, 2], [1]),
    "masked_scatter": (lambda x, i: x[:, 0].masked_scatter(x[:, 0] < 4, i * 1.0), [3], [3, 4]),
    "histc": (lambda x, i: torch.histc(i / (i - 2.0), bins=3), [1, 2], [0, 3]),
    "histogram": (lambda x, i: torch.histogram(i / (i - 2.0), bins=3).hist, [2, 1], [0, 3]),
}


#: Decomposed at their autograd key under torch.compile, before any check sees them: the
#: gather of their targets raises (RuntimeError, its own message), as under aot_eager.
GATHERED_ON_THE_COMPILE_PATH = {"multi_margin_loss", "multilabel_margin_loss"}


def _cpu_error(fn, index):
    with pytest.raises((IndexError, RuntimeError)) as info:
        fn(X, torch.tensor(index))
    return info.value


def _assert_like_eager(error, expected, name: str, gathered: bool = False):
    """``error`` has eager's type and message (``gathered``: a gather's), then the op's name
    and the calling line."""
    assert type(error) is type(expected), (error, expected)
    message = str(error)
    if gathered:
        assert re.match(r"index -?\d+ is out of bounds for dimension", message), message
    else:
        assert message.startswith(str(expected).splitlines()[0]), (message, expected)
    assert "test_index_checks.py:" in message, message
    line = HELPER_LINES.get(name, f'"{name}": (lambda')
    assert line in message, message


@pytest.fixture(autouse=True)
def fresh():
    torchtpu_compile.reset_stats()
    yield


@pytest.mark.parametrize("name", list(OPS))
def test_compile_path_raises_as_eager_then_runs_again(name):
    fn, bad, good = OPS[name]
    expected = _cpu_error(fn, bad)
    compiled = compile_tpu(fn, dynamic=False)
    torch.testing.assert_close(compiled(X, torch.tensor(good)), fn(X, torch.tensor(good)))
    with pytest.raises(type(expected)) as info:
        compiled(X, torch.tensor(bad))
    _assert_like_eager(info.value, expected, name, name in GATHERED_ON_THE_COMPILE_PATH)
    # Raised once: the next correct call works.
    torch.testing.assert_close(compiled(X, torch.tensor(good)), fn(X, torch.tensor(good)))



@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("eager_mode", ["strict"], indirect=True)
def test_eager_device_raises_at_the_next_synchronization(name, eager_mode):
    fn, bad, good = OPS[name]
    expected = _cpu_error(fn, bad)
    x = X.to("tpu")
    torch.testing.assert_close(fn(x, torch.tensor(good).to("tpu")).cpu(),
                               fn(X, torch.tensor(good)))
    out = fn(x, torch.tensor(bad).to("tpu"))  # runs on the device: no error yet
    with pytest.raises(type(expected)) as info:
        out.cpu()
    _assert_like_eager(info.value, expected, name)
    assert "synchronization point" in str(info.value)
    torch.testing.assert_close(fn(x, torch.tensor(good).to("tpu")).cpu(),
                               fn(X, torch.tensor(good)))


@pytest.mark.parametrize("eager_mode", ["debug"], indirect=True)
def test_debug_mode_raises_at_the_op(eager_mode):
    x, i = X.to("tpu"), torch.tensor([1, 5]).to("tpu")
    with pytest.raises(IndexError, match=re.escape(
            "index 5 is out of bounds for dimension 0 with size 4 (aten.index")) as info:
        x[i]  # the op to blame
    assert "the op to blame" in str(info.value)
    assert "synchronization point" not in str(info.value)
    torch.testing.assert_close(x[torch.tensor([-1]).to("tpu")].cpu(), X[[-1]])


@pytest.mark.parametrize("eager_mode", ["defer_and_fuse", "strict"], indirect=True)
def test_error_names_the_failing_op_among_several(eager_mode):
    x = X.to("tpu")
    good, bad = torch.tensor([3]).to("tpu"), torch.tensor([0, 4]).to("tpu")
    a = F.embedding(good, x)
    b = torch.gather(x, 0, _rows(bad))  # this one is out of range
    c = x[good]
    with pytest.raises(RuntimeError, match="aten.gather") as info:
        torch.tpu.synchronize()
    assert "this one is out of range" in str(info.value)
    (a + c).cpu()  # raised once, then cleared
    del b



@pytest.mark.parametrize("eager_mode", ["strict", "defer_and_fuse"], indirect=True)
@pytest.mark.parametrize("bad", [[0, 3, 2], [[1, -1]]])
def test_one_hot_class_values_out_of_range_raise_as_eager_on_the_device(bad, eager_mode):
    # PyTorch checks them on the CPU only: on the device F.one_hot(i, 3) of a 3 gave a row of
    # zeros (an MoE's dispatch mask silently dropping a token) where eager raises.
    with pytest.raises(RuntimeError) as expected:
        F.one_hot(torch.tensor(bad), 3)
    good = torch.tensor([[2, 0, 1]])
    torch.testing.assert_close(F.one_hot(good.to("tpu"), 3).cpu(), F.one_hot(good, 3))
    out = F.one_hot(torch.tensor(bad).to("tpu"), 3)  # the line the error names
    with pytest.raises(RuntimeError) as info:
        out.cpu()
    assert str(info.value).startswith(str(expected.value)), (info.value, expected.value)
    assert "the line the error names" in str(info.value)
    torch.testing.assert_close(F.one_hot(good.to("tpu"), 3).cpu(), F.one_hot(good, 3))

@pytest.mark.parametrize("eager_mode", ["strict", "defer_and_fuse"], indirect=True)
@pytest.mark.parametrize("values", [[0, -1, 1], [[-2, -1]], [[0, 3], [1, 1]]])
def test_one_hot_sized_by_its_values_checks_them_as_eager(values, eager_mode):
    # Without num_classes, a negative class value gave a row of zeros where eager raises.
    try:
        want = F.one_hot(torch.tensor(values))
    except RuntimeError as expected:
        with pytest.raises(RuntimeError, match=str(expected)):
            F.one_hot(torch.tensor(values).to("tpu")).cpu()
    else:
        torch.testing.assert_close(F.one_hot(torch.tensor(values).to("tpu")).cpu(), want)


def test_compiled_graph_on_tpu_tensors_raises_at_the_next_synchronization():
    compiled = compile_tpu(lambda w, i: F.embedding(i, w) * 2)
    w = X.to("tpu")
    out = compiled(w, torch.tensor([4]).to("tpu"))
    assert out.device.type == "tpu"
    with pytest.raises(IndexError, match=r"index out of range in self \(aten.embedding"):
        out.cpu()
    torch.testing.assert_close(compiled(w, torch.tensor([2]).to("tpu")).cpu(), X[[2]] * 2)


def test_aot_artifact_raises_as_eager(tmp_path):
    from torchtpu_compile import aot
    model = torch.nn.Embedding(10, 3)
    path = aot.compile(model, (torch.tensor([[1, 2]]),)).save(str(tmp_path / "emb.tpu"))
    run = aot.load(path)
    with pytest.raises(IndexError, match=re.escape("index out of range in self (aten.embedding")):
        run(torch.tensor([[1, 10]]))
    torch.testing.assert_close(run(torch.tensor([[9, 0]])), model(torch.tensor([[9, 0]])))
    out = run(torch.tensor([[1, -1]]).to("tpu"))  # device inputs: checked at synchronization
    with pytest.raises(IndexError, match="aten.embedding"):
        out.cpu()


def _check_slots(fn, *args):
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchtpu_compile.lower.calling_convention import prepare
    from torchtpu_compile.lower.decompositions import decomposition_table
    from torchtpu_compile.lower.fx_passes import normalize
    gm = make_fx(fn, decomposition_table=decomposition_table(), tracing_mode="fake")(*args)
    normalize(gm)  # as every path does before prepare
    return [slot for slot in prepare(gm).outputs if slot.kind == "check"]


def test_indexing_built_by_decompositions_is_not_checked():
    image = torch.randn(1, 2, 4, 4)
    # Upsampling gathers through _unsafe_index (in range by construction), embedding's
    # backward scatters: neither is the user's indexing, and neither pays for a check.
    assert _check_slots(lambda x: F.interpolate(x, scale_factor=2), image) == []
    assert _check_slots(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), image) == []
    assert _check_slots(lambda g, i: torch.ops.aten.embedding_dense_backward(g, i, 4, -1, False),
                        torch.ones(2, 3), torch.tensor([1, 2])) == []
    assert _check_slots(lambda x: x.sin() + 1, image) == []
    # The user's own indexing is checked once, though its decomposition scatters.
    [slot] = _check_slots(lambda x, i: x.index_put((i,), torch.tensor(1.0)), X, torch.tensor([1]))
    assert [spec["op"] for spec in slot.value] == ["aten.index_put"]


def test_checks_can_be_turned_off():
    with config.patch(check_indices=False):
        compiled = compile_tpu(lambda x, i: x[i] * 1)
        out = compiled(X, torch.tensor([7]))  # clamped by XLA, as before the checks
    assert out.shape == (1, 2)


def test_in_range_values_match_eager_on_the_unsafe_index_path():
    image = torch.randn(1, 2, 3, 5)
    fn = lambda x: F.interpolate(x, size=(7, 4), mode="nearest")  # noqa: E731
    torch.testing.assert_close(compile_tpu(fn)(image), fn(image))


def test_backward_does_not_check_the_forward_indices_again():
    # x[i]'s backward scatters with i, and gather's with its index: checked in the forward.
    from functorch.compile import aot_function, make_boxed_func

    from torchtpu_compile.lower.decompositions import decomposition_table
    from torchtpu_compile.lower.index_checks import INDEX_CHECK
    graphs = []

    def capture(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm.forward)
    fn = aot_function(lambda x, i: (x[i] * 2).sum() + torch.gather(x, 0, _rows(i)).sum(),
                      capture, capture, decompositions=decomposition_table())
    x = torch.randn(4, 2, requires_grad=True)
    fn(x, torch.tensor([1, 3])).backward()
    marks = [[n.args[4] for n in g.graph.nodes if n.target is INDEX_CHECK] for g in graphs]
    assert marks == [["aten.index", "aten.gather"], []]


class _IndexInBackward(torch.autograd.Function):
    """Indexes in its backward, so the autograd engine runs that op on the device first."""

    @staticmethod
    def forward(ctx, x, i):
        ctx.save_for_backward(i)
        return x * 1

    @staticmethod
    def backward(ctx, grad):
        (i,) = ctx.saved_tensors
        return grad + grad[i].sum() * 0, None


def _hooked(x, i):
    y = x * 2
    y.register_hook(lambda grad: grad[i].repeat(2))
    return y


@pytest.mark.parametrize("fn", [_IndexInBackward.apply, _hooked],
                         ids=["autograd.Function", "tensor hook"])
def test_indices_the_users_backward_code_makes_are_checked(fn, fresh_dynamo):
    # Backward formulas index with the forward's (checked) indices, so backward graphs were
    # not marked at all; an index out of range in an autograd.Function's backward or a tensor
    # hook gave gradients from clamped indices where eager raises.
    x = torch.randn(4, requires_grad=True)
    message = "index 9 is out of bounds for dimension 0 with size 4"
    with pytest.raises(IndexError, match=message):
        fn(x, torch.tensor([1, 9])).sum().backward()  # eager
    with pytest.raises(IndexError, match=message):
        compile_tpu(fn)(x, torch.tensor([1, 9])).sum().backward()
    grad = torch.autograd.grad(compile_tpu(fn)(x, torch.tensor([1, 3])).sum(), x)
    torch.testing.assert_close(grad, torch.autograd.grad(fn(x, torch.tensor([1, 3])).sum(), x))


@pytest.mark.parametrize("eager_mode", ["strict"], indirect=True)
def test_eager_op_first_seen_in_a_backward_still_checks_the_users_call(eager_mode):
    # The device keeps one program per op signature: the one traced while autograd ran the
    # backward also serves x[i] called by the user afterwards, which must be checked.
    x = torch.randn(5, 3).to("tpu").requires_grad_()
    _IndexInBackward.apply(x, torch.tensor([4, 1]).to("tpu")).sum().backward()
    x.grad.cpu()
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 0 with size 5"):
        x.detach()[torch.tensor([0, 5]).to("tpu")].cpu()


def test_eager_view_reads_and_writes_are_not_checked():
    # They gather and scatter at positions computed from the view's geometry: in range.
    from torchtpu_compile.lower.index_checks import INDEX_CHECK
    from torchtpu_eager import views
    read = views._read_graph((4, 6), torch.float32, (3, 2), (6, 2), 1)
    write = views._write_graph((4, 6), torch.float32, (3, 2), (6, 2), 1)
    for graph in (read, write):
        assert not graph.checked
        assert not any(n.target is INDEX_CHECK for n in graph.gm.graph.nodes)
    x = torch.arange(24.0).reshape(4, 6)
    torch.testing.assert_close(x.to("tpu")[:3, 1::2].contiguous().cpu(),
                               x[:3, 1::2].contiguous())


def test_bucketed_dynamic_graph_checks_only_real_indices():
    # The padding of a bucket holds no index of the user's: only real indices are checked,
    # and the mark does not keep the graph from being bucketed.
    torch.manual_seed(0)
    table = torch.nn.Embedding(10, 4)
    compiled = compile_tpu(lambda ids: table(ids).sum(-1), dynamic=True)
    for n in (3, 5, 6):
        ids = torch.randint(0, 10, (2, n))
        torch.testing.assert_close(compiled(ids), table(ids).sum(-1))
    with pytest.raises(IndexError, match=r"index out of range in self \(aten.embedding: "
                                         r"index 10 of dim 0 of size 10"):
        compiled(torch.tensor([[1, 2, 3, 10, 1]]))
    stats = torchtpu_compile.stats()["buckets"]
    assert stats["exact_shape_compiles"] == 0 and stats["hits"] >= 2


def test_integer_division_checks_only_real_divisors_of_a_bucketed_graph():
    # A divisor's padding must not read as a zero; a real zero raises as eager does, and float
    # division (inf, nan) is not checked at all.
    compiled = compile_tpu(lambda a, b: a // b + a % b, dynamic=True)
    for n in (3, 5, 6, 7):
        a, b = torch.randint(-9, 9, (n,)), torch.randint(1, 5, (n,))
        torch.testing.assert_close(compiled(a, b), a // b + a % b)
    with pytest.raises(RuntimeError, match=r"ZeroDivisionError \(aten.floor_divide: an "
                                           r"integer division by a tensor holding zero"):
        compiled(torch.arange(5), torch.tensor([1, 2, 0, 1, 1]))
    assert torchtpu_compile.stats()["buckets"]["exact_shape_compiles"] == 0
    floats = compile_tpu(lambda a, b: a // b + torch.fmod(a, b), dynamic=False)
    a, b = torch.tensor([1.0, -2.0, 0.0]), torch.tensor([0, 1, 0])
    torch.testing.assert_close(floats(a, b), a // b + torch.fmod(a, b), equal_nan=True)


def _eager_or_error(fn, *args):
    try:
        return fn(*args), None
    except IndexError as exc:
        return None, exc


def _returns_or_raises_as_eager(compiled, fn, *args):
    expected, error = _eager_or_error(fn, *args)
    if error is None:
        torch.testing.assert_close(compiled(*args), expected)
    else:
        with pytest.raises(IndexError, match=re.escape(str(error))):
            compiled(*args)


def test_an_index_past_the_real_size_of_a_bucketed_dim_raises_as_eager():
    # Bucket 8 serves sizes 5 and 7 (16 serves 13): an index between the real size and the
    # bucket's, or below minus the real size, raises eager's IndexError with eager's message
    # (the real size in it); the real ones, negative too, give eager's values.
    def rows(x, i):
        return x[i] * 2
    compiled = compile_tpu(rows, dynamic=True)
    for n in (5, 7, 13):
        x = torch.randn(n, 3)
        for i in (n - 1, -n, n, n + 2, -n - 1):
            index = torch.tensor([0, i])
            _returns_or_raises_as_eager(compiled, rows, x, index)
    stats = torchtpu_compile.stats()["buckets"]
    assert stats["exact_shape_compiles"] == 0 and stats["compiles"] == 2


def test_an_ignored_index_that_is_a_bucketed_size_is_ignored_as_eager():
    # BERT QA's loss: ``ignore_index=start_logits.size(1)``, a size known only at run time.
    # The target equal to the real size is ignored; one past it, or negative, raises eager's
    # error; the rule took the size for an int and every length compiled a program of its own.
    def loss(logits, positions):
        return F.cross_entropy(logits, positions, ignore_index=logits.shape[1])
    compiled = compile_tpu(loss, dynamic=True)
    for n in (5, 7, 13):
        logits = torch.randn(3, n)
        for bad in (n - 1, n, n + 1, -1):
            positions = torch.tensor([0, bad, n])
            _returns_or_raises_as_eager(compiled, loss, logits, positions)
    stats = torchtpu_compile.stats()
    assert stats["buckets"]["exact_shape_compiles"] == 0 and stats["buckets"]["compiles"] == 2
    assert stats["fallback_ops"] == {}


def test_literal_indices_in_range_are_checked_on_the_host_once():
    # Masks and position ids built from arange: folded on the host, found in range, and no
    # check is left in the program. An index that is a literal out of range still raises.
    def positions(table):
        return F.embedding(torch.arange(4), table) + table[torch.arange(3, -1, -1)]
    assert _check_slots(positions, X) == []
    compiled = compile_tpu(lambda t: t[torch.arange(2, 6)] * 1)
    with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 0 with size 4"):
        compiled(X)


def _bag(w, i):
    return F.embedding_bag(i, w, torch.tensor([0, 1], device=i.device), mode="max")


def test_embedding_bag_raises_eager_error_on_both_paths():
    # nn.EmbeddingBag lowers now (it ran on the host, which raised): its indices are checked,
    # with the error of CPU's general kernel (its fast float sum and mean word it otherwise).
    for bad in (4, -1):
        expected = str(_cpu_error(_bag, [0, bad]))
        assert expected.startswith("embedding_bag: Expected idx >= 0 && idx < num_embeddings")
        with pytest.raises(RuntimeError, match=re.escape(expected + " (aten.embedding_bag")):
            compile_tpu(_bag)(X, torch.tensor([0, bad]))
    out = _bag(X.to("tpu"), torch.tensor([-1, 0]).to("tpu"))
    with pytest.raises(RuntimeError, match=re.escape(expected)) as info:
        out.cpu()
    assert "return F.embedding_bag(i, w" in str(info.value)
    torch.testing.assert_close(_bag(X.to("tpu"), torch.tensor([3, 0]).to("tpu")).cpu(),
                               _bag(X, torch.tensor([3, 0])))


def test_embedding_bag_offsets_past_the_input_raise_eager_error_on_both_paths():
    # Eager refuses a last offset greater than the input's length (include_last_offset or
    # not); both paths returned sums.
    i = torch.tensor([1, 2, 3])
    for offsets, last in ((torch.tensor([0, 5]), False), (torch.tensor([0, 2, 5]), True)):
        def bag(w, i, o, last=last):
            return F.embedding_bag(i, w, o, mode="sum", include_last_offset=last)
        with pytest.raises(RuntimeError) as cpu:
            bag(X, i, offsets)
        expected = str(cpu.value)
        assert expected.startswith("offsets[-1] can not be greater than input's length 3")
        with pytest.raises(RuntimeError, match=re.escape(expected)):
            compile_tpu(bag)(X, i, offsets)
        with pytest.raises(RuntimeError, match=re.escape(expected)):
            bag(X.to("tpu"), i.to("tpu"), offsets.to("tpu")).cpu()


def _bag_at(w, i, offsets):
    return F.embedding_bag(i, w, offsets, mode="sum")


def test_embedding_bag_offsets_not_starting_at_zero_raise_eager_error_on_both_paths():
    # Eager refuses offsets whose first value is not 0; both paths returned sums (a text
    # classifier's offsets built from the wrong cumsum trained on garbage bags, silently).
    i, offsets = torch.tensor([1, 2, 3]), torch.tensor([1, 2])
    with pytest.raises(RuntimeError) as cpu:
        _bag_at(X, i, offsets)
    expected = str(cpu.value).splitlines()[0]   # then eager prints the tensor: "[ torch.Long..."
    assert expected.startswith("offsets[0] has to be 0")
    with pytest.raises(RuntimeError, match=re.escape(expected)):
        compile_tpu(_bag_at)(X, i, offsets)
    with pytest.raises(RuntimeError, match=re.escape(expected)):
        _bag_at(X.to("tpu"), i.to("tpu"), offsets.to("tpu")).cpu()
    good = torch.tensor([0, 2])
    torch.testing.assert_close(compile_tpu(_bag_at)(X, i, good), _bag_at(X, i, good))
    torch.testing.assert_close(compile_tpu(_bag_at)(X, i, torch.tensor([0, 3])),
                               _bag_at(X, i, torch.tensor([0, 3])))
    torch.testing.assert_close(_bag_at(X.to("tpu"), i.to("tpu"), good.to("tpu")).cpu(),
                               _bag_at(X, i, good))


def _fill_rows(x, i):
    return x.new_ones((i.numel(),) + x.shape[1:])


# An index out of range into a tensor with no element: eager's kernels of these ops touch
# nothing and return (fuzz seed 5182: index_add of index -1 into a (2, 0) tensor), or raise
# RuntimeError with messages of their own (index_select, embedding). name -> (fn(x, i), x's
# shape, an index; the same behaviour with every shape).
EMPTY = {
    "index_add": (lambda x, i: x.index_add(0, i, _fill_rows(x, i)), (2, 0), [0, 1, -1]),
    "index_add_empty_dim": (lambda x, i: x.index_add(0, i, _fill_rows(x, i)), (0, 3), [4]),
    "index_copy": (lambda x, i: x.index_copy(0, i, _fill_rows(x, i)), (3, 0, 2), [5]),
    "index_fill": (lambda x, i: x.index_fill(0, i, 3.0), (2, 0), [-3]),
    "index": (lambda x, i: x[i] * 1, (2, 0), [5]),
    "index_dim1": (lambda x, i: x[:, i] * 1, (0, 3), [5]),
    "index_put": (lambda x, i: x.index_put((i,), torch.tensor(7.0)), (2, 0), [2]),
    "index_put_accumulate": (lambda x, i: x.index_put((i,), torch.tensor(7.0), True), (2, 0),
                             [-3]),
    "index_select": (lambda x, i: torch.index_select(x, 0, i), (2, 0), [5]),
    # checked whatever the shapes; its decomposition's scatter of no element dropped the check
    "index_reduce": (lambda x, i: x.index_reduce(0, i, _fill_rows(x, i), "prod"), (2, 0),
                     [0, 5]),
    "index_select_empty_dim": (lambda x, i: torch.index_select(x, 1, i), (2, 0), [0]),
    "embedding": (lambda x, i: F.embedding(i, x), (2, 0), [-1]),
    # an integer division of no element by a zero divisor: nothing divided (fuzz seed 5313)
    "floor_divide_by_zero": (lambda x, i: torch.div(x.long(), i, rounding_mode="floor"), (0,),
                             [0]),
    "remainder_by_a_zero_number": (lambda x, i: x.long() % 0 + i.sum(), (0, 2), [0]),
}


def _outcome(fn):
    try:
        return fn().cpu()
    except (IndexError, RuntimeError) as exc:
        return exc


def _assert_same_outcome(actual, expected):
    if isinstance(expected, BaseException):
        assert type(actual) is type(expected), (actual, expected)
        assert str(actual).startswith(str(expected).splitlines()[0]), (actual, expected)
    else:
        assert isinstance(actual, torch.Tensor), actual
        torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("name", list(EMPTY))
@pytest.mark.parametrize("path", ["compile", "strict", "defer_and_fuse"])
def test_an_index_into_a_tensor_with_no_element_is_checked_as_eager_checks_it(name, path):
    fn, shape, index = EMPTY[name]
    expected = _outcome(lambda: fn(torch.zeros(shape), torch.tensor(index)))
    if path == "compile":
        actual = _outcome(lambda: compile_tpu(fn)(torch.zeros(shape), torch.tensor(index)))
    else:
        previous = torch.tpu.get_eager_mode()
        torch.tpu.set_eager_mode(path)
        try:
            actual = _outcome(lambda: fn(torch.zeros(shape, device="tpu"),
                                         torch.tensor(index, device="tpu")))
        finally:
            torch.tpu.set_eager_mode(previous)
    _assert_same_outcome(actual, expected)


@pytest.mark.parametrize("fn", [
    lambda a, s: a // s, lambda a, s: a % s, lambda a, s: torch.fmod(a, s),
    lambda a, s: torch.div(a, s, rounding_mode="trunc")], ids=["//", "%", "fmod", "trunc"])
def test_a_dynamic_int_divisor_of_zero_raises_as_eager(fn, fresh_dynamo):
    # Under dynamic=True a Python int divisor is a symbol, left unchecked: a // 0 gave -1.
    compiled = compile_tpu(fn, dynamic=True)
    a = torch.tensor([7, -8], dtype=torch.int32)
    for s in (2, -3):
        got, want = compiled(a, s), fn(a, s)
        assert got.dtype == want.dtype and torch.equal(got, want)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a, 0)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compiled(a, 0)


@pytest.mark.parametrize("fn", [
    lambda x, w: x[torch.argwhere(x > 0.3).flatten()].softmax(0),
    lambda x, w: torch.repeat_interleave(x, torch.tensor([1, 0, 2, 1, 0])),
    lambda x, w: F.embedding(torch.arange(5)[x > 0], w).sum(0),
    lambda x, w: x.index_select(0, torch.nonzero(x > 0).flatten()) * 2,
], ids=["getitem", "repeat_interleave", "embedding", "index_select"])
def test_indices_of_a_length_the_data_decides_are_traced(fn, fresh_dynamo):
    # Under capture_dynamic_output_shape_ops, marking asked whether such an index was empty:
    # GuardOnDataDependentSymNode, where eager and aot_eager return (MoE token routing).
    x, w = torch.tensor([0.5, -1.0, 2.0, 0.1, 0.7]), torch.randn(5, 3)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        torch.testing.assert_close(compile_tpu(fn)(x, w), fn(x, w))


@pytest.mark.parametrize("path", ["compile", "strict"])
@pytest.mark.parametrize("fn", [lambda x: x // 256, lambda x: x % -256,
                                lambda x: torch.fmod(x, 512),
                                lambda x: torch.div(x, 256, rounding_mode="floor")],
                         ids=["floor_divide", "remainder", "fmod", "div_floor"])
def test_a_number_divisor_that_wraps_to_zero_raises_as_eager(fn, path):
    # Eager's integer kernels read the number in the dividend's dtype: uint8 // 256 divides by
    # 0 and raises. The check looked at 256, and XLA's division by 0 gave 255s.
    x = torch.tensor([200, 10], dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(x)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        if path == "compile":
            compile_tpu(fn, dynamic=False)(x)
        else:
            fn(x.to("tpu")).cpu()
    torch.testing.assert_close(compile_tpu(lambda x: x // 300, dynamic=False)(x), x // 300)


def test_an_empty_data_dependent_index_is_checked_as_no_index():
    # An MoE expert that gets no token, with Dynamo capturing data-dependent shapes: the graph
    # after where() runs at its exact size 0, and the check's minimum over no index raised
    # "reducing over zero-size dimension" where eager adds nothing.
    w = torch.randn(3, 4)

    def expert(x, chosen):
        rows = torch.where(chosen == 1)[0]
        return torch.zeros(x.shape[0], 4).index_add_(0, rows, x[rows] @ w)

    compiled = compile_tpu(expert)
    x = torch.randn(5, 3)
    # (monkeypatch.setattr on Dynamo's config deletes the setting when it undoes)
    with config.patch(matmul_precision="highest"), \
            torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        for chosen in (torch.tensor([0, 1, 0, 1, 2]), torch.tensor([0, 0, 0, 2, 2])):
            torch.testing.assert_close(compiled(x, chosen), expert(x, chosen))
