"""The loss decompositions (torchtpu_compile/lower/decompositions/losses.py) against eager CPU
PyTorch, in strict mode: the op must run through XLA, not fall back, and give eager's numbers."""
from __future__ import annotations

import pytest
import torch

from tests.support.decomposition_checks import check_on_both_paths, randn
from tests.support.helpers import compile_tpu
from torchtpu_compile import config

pytestmark = pytest.mark.usefixtures("fresh_dynamo")
aten = torch.ops.aten

F = torch.nn.functional
# Rows whose labels end before the last slot (the -1), and a 1-D input.
TARGETS = [torch.tensor([[1, 2, 3, -1], [3, 0, -1, 1], [0, 1, 2, 3]]), torch.tensor([2, -1, 0, 1])]


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("target", TARGETS, ids=["2d", "1d"])
def test_multilabel_margin_loss(target, reduction):
    # PyTorch's reference decomposition counted the slots after a row's -1 as label 0 (a wrong
    # loss, silently) and gave a 1-D input's unreduced loss shape [1] where eager gives [].
    def loss(x, t):
        return F.multilabel_margin_loss(x, t, reduction=reduction)
    x = randn(*target.shape)
    check_on_both_paths(loss, x, target, rtol=1e-5, atol=1e-6)
    assert compile_tpu(loss)(x, target).shape == loss(x, target).shape

    def grad(x, t):
        return torch.autograd.grad(loss(x, t).sum(), x)[0]
    with config.patch(matmul_precision="highest"):
        x_compiled = x.clone().requires_grad_()
        actual = torch.autograd.grad(compile_tpu(loss)(x_compiled, target).sum(), x_compiled)[0]
    torch.testing.assert_close(actual, grad(x.clone().requires_grad_(), target))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss_of_a_0d_input(reduction):
    # Eager takes a 0-d input (one row of one class; OpInfo's first sample): our decomposition's
    # shape check parsed as "(...) if input.dim() else False" and refused every 0-d input, so
    # the eager device ran the op on the host.
    def loss(x, t):
        return F.multilabel_margin_loss(x, t, reduction=reduction)
    for target in (torch.tensor(0), torch.tensor(-1)):
        check_on_both_paths(loss, torch.tensor(0.7), target)


@pytest.mark.parametrize("p, weighted", [(1, False), (2, True)])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multi_margin_loss_of_one_sample_has_eager_s_shape(reduction, p, weighted):
    # PyTorch's reference made every unreduced loss 1-D: one sample with a 0-d target (a 1-D
    # or 0-d input) came back with shape [1] where eager gives [], on every path, silently.
    def loss(x, t, w):
        return F.multi_margin_loss(x, t, p=p, weight=w if weighted else None,
                                   reduction=reduction)
    for x, target in ((randn(5), torch.tensor(2)), (torch.tensor(0.7), torch.tensor(0)),
                      (randn(5), torch.tensor([3])), (randn(3, 5), torch.tensor([4, 0, 2]))):
        weight = torch.rand(x.shape[-1] if x.dim() else 1)
        check_on_both_paths(loss, x, target, weight, rtol=1e-6, atol=1e-6)

        def grad(x, t, w):
            return torch.autograd.grad(loss(x, t, w).sum(), x)[0]
        x_compiled = x.clone().requires_grad_()
        actual = torch.autograd.grad(compile_tpu(loss)(x_compiled, target, weight).sum(),
                                     x_compiled)[0]
        torch.testing.assert_close(actual, grad(x.clone().requires_grad_(), target, weight))


def _one_hot_sum(value, scale, index):
    # The shape of the log-softmax backward's sum of nll_loss's gradient along the classes.
    positions = torch.arange(5).view(1, -1)
    one_hot = torch.where(positions == index, value, torch.zeros(4, 5))
    return (one_hot * scale).sum(1, keepdim=True)


def test_a_sum_of_a_one_hot_product_sums_nothing_and_is_eagers():
    # fx_passes.sum_of_one_hot_product: no (tokens x classes) reduction is left, and the sum is
    # eager's to the bit, signed zeros, infinities and NaN included: scales 0, -0, inf, NaN
    # and a plain one; an index out of range (no match: the zeros alone).
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchtpu_compile.lower import fx_passes

    value = torch.tensor([[-1.0], [2.0], [float("inf")], [-0.0]])
    index = torch.tensor([[3], [0], [4], [7]])
    for scale in ([[0.0], [-0.0], [1.5], [-0.0]], [[float("inf")], [float("nan")], [-0.0], [2.0]],
                  [[-0.0], [0.0], [0.0], [float("-inf")]]):
        scale = torch.tensor(scale)
        gm = make_fx(_one_hot_sum, tracing_mode="fake")(value, scale, index)
        fx_passes.normalize(gm)
        assert aten.sum.dim_IntList not in {n.target for n in gm.graph.nodes}, gm.graph
        expected = _one_hot_sum(value, scale, index)
        for got in (gm(value, scale, index), compile_tpu(_one_hot_sum)(value, scale, index)):
            torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
            assert torch.equal(got.signbit(), expected.signbit()), (got, expected)


@pytest.mark.parametrize("case", ["mean", "sum", "none", "weighted", "smoothed", "3d"])
def test_cross_entropy_gradients_are_eagers(case):
    # Each reduction, class weights and label smoothing (the graphs the pass above meets in a
    # language model's loss, and around it), ignored positions in every one.
    kwargs = {"weighted": {"weight": randn(7, seed=2).abs() + 0.5},
              "smoothed": {"label_smoothing": 0.1},
              "none": {"reduction": "none"}, "sum": {"reduction": "sum"}}.get(case, {})
    shape = (3, 7, 4) if case == "3d" else (6, 7)
    logits = randn(*shape)
    target = torch.randint(0, 7, shape[:1] + shape[2:], generator=torch.Generator().manual_seed(1))
    target.view(-1)[::3] = -100

    def grads(x):
        x = x.detach().requires_grad_()
        loss = F.cross_entropy(x, target, **kwargs)
        loss.sum().backward()
        return loss, x.grad

    with config.patch(strict=True, matmul_precision="highest"):
        compiled = torch.compile(lambda x: F.cross_entropy(x, target, **kwargs),
                                 backend="torchtpu")
        x = logits.clone().requires_grad_()
        loss = compiled(x)
        loss.sum().backward()
    expected_loss, expected_grad = grads(logits)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad, expected_grad, rtol=1e-5, atol=1e-6)


def test_a_one_hot_sum_whose_nodes_carry_no_values_is_left_as_it_is():
    # Graphs another pass made may lack a node's value metadata: the rewrite cannot check
    # dtypes and shapes there, so it leaves the sum (it raised AttributeError).
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchtpu_compile.lower import fx_passes

    args = (torch.tensor([[-1.0]] * 4), randn(4, 1), torch.tensor([[3], [0], [4], [1]]))
    gm = make_fx(_one_hot_sum, tracing_mode="fake")(*args)
    for node in gm.graph.nodes:
        if node.target is aten.zeros.default:
            del node.meta["val"]
    fx_passes.normalize(gm)
    assert aten.sum.dim_IntList in {n.target for n in gm.graph.nodes}
    torch.testing.assert_close(gm(*args), _one_hot_sum(*args), rtol=0, atol=0)


@pytest.mark.parametrize("case", ["mean", "sum", "none", "weighted", "bias", "all_ignored",
                                  "bfloat16"])
def test_chunked_linear_cross_entropy_is_eagers_without_a_fallback(case):
    """``F.linear_cross_entropy(..., options=LinearCrossEntropyOptions())``, the memory-minded
    LM loss, runs as torch.nn's chunked custom ops, which fell back to eager on every path.
    Under strict (a fallback raises) its loss and the gradients of the input, the head's
    weight and bias match eager's chunked path: compiled, and on the eager tpu device."""
    from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions
    dtype = torch.bfloat16 if case == "bfloat16" else torch.float32
    rows, features, classes = 24, 8, 40
    hidden = randn(rows, features, seed=3).to(dtype)
    head = (randn(classes, features, seed=4) * 0.3).to(dtype)
    bias = (randn(classes, seed=5) * 0.1).to(dtype) if case == "bias" else None
    target = torch.randint(0, classes, (rows,), generator=torch.Generator().manual_seed(6))
    target[::4] = -100
    if case == "all_ignored":
        target[:] = -100
    kwargs = {"weight": (randn(classes, seed=7).abs() + 0.5).to(dtype)} \
        if case == "weighted" else {}
    reduction = case if case in ("sum", "none") else "mean"
    # chunks of 10, 10 and 4 rows
    options = LinearCrossEntropyOptions(batch_chunk_size=10, chunking_method=None,
                                        allow_retain_graph=True)

    def loss_and_grads(loss_of, device="cpu"):
        leaves = [t.detach().to(device).requires_grad_() for t in (hidden, head)]
        if bias is not None:
            leaves.append(bias.detach().to(device).requires_grad_())
        loss = loss_of(*leaves)
        loss.sum().backward()
        return [t.detach().cpu() for t in [loss] + [leaf.grad for leaf in leaves]]

    def loss_of(x, w, b=None):
        return F.linear_cross_entropy(x, w, target.to(x.device), linear_bias=b,
                                      reduction=reduction, options=options,
                                      **{k: v.to(x.device) for k, v in kwargs.items()})

    expected = loss_and_grads(loss_of)
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else \
        {"rtol": 1e-5, "atol": 1e-6}
    with config.patch(strict=True, matmul_precision="highest"):
        compiled = loss_and_grads(torch.compile(loss_of, backend="torchtpu"))
        on_device = loss_and_grads(loss_of, "tpu")
    for got in (compiled, on_device):
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, equal_nan=True, **tolerance)
    if case == "all_ignored":
        assert expected[0].isnan() and compiled[0].isnan()
