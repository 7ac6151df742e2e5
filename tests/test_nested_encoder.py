"""nn.TransformerEncoder's fast path on the tpu device (eval mode, no grad, a padding mask):
PyTorch packs the batch into a nested tensor (``torchtpu_eager/nested.py``). Each result is
compared with eager CPU's, padded positions (zeros on CPU) included."""
import pytest
import torch
from torch import nn

import torchtpu_eager  # noqa: F401  (registers the device)
from torchtpu_compile import config

# Left-aligned padding, a row of padding only, no padding.
PAD = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [True] * 5, [False] * 4 + [True]])


@pytest.fixture
def mode(eager_mode):
    with config.patch(matmul_precision="highest"):
        yield eager_mode


def _both(model, *inputs, **kwargs):
    """(eager CPU's result, the tpu device's result on CPU) of ``model`` in eval, no grad."""
    model.eval()
    with torch.no_grad():
        want = model(*inputs, **kwargs)
        moved = {k: v.to("tpu") for k, v in kwargs.items()}
        got = model.to("tpu")(*(x.to("tpu") for x in inputs), **moved)
    model.to("cpu")
    return want, got.cpu()


@pytest.mark.parametrize("norm_first,activation,final_norm", [
    (False, "relu", False), (False, "gelu", True), (True, "relu", False)])
def test_encoder_fast_path_gives_cpus_numbers(mode, norm_first, activation, final_norm):
    # It raised NotImplementedError (aten._nested_tensor_from_mask); CUDA runs it.
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True,
                                       norm_first=norm_first, activation=activation)
    encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(16) if final_norm else None)
    x = torch.randn(4, 5, 16)
    want, got = _both(encoder, x, src_key_padding_mask=PAD)
    fast_path = not norm_first and not final_norm  # norm_first: PyTorch's slow path, NaN rows
    assert not fast_path or torch.equal(want[PAD], torch.zeros_like(want[PAD]))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_transformer_with_padding_masks_gives_cpus_numbers(mode):
    torch.manual_seed(0)
    model = nn.Transformer(16, 2, 1, 1, 32, dropout=0.0, batch_first=True)
    src, tgt = torch.randn(4, 5, 16), torch.randn(4, 3, 16)
    want, got = _both(model, src, tgt, src_key_padding_mask=PAD, memory_key_padding_mask=PAD)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_nested_from_mask_and_back_to_padded(mode):
    x = torch.randn(4, 5, 3)
    keep = PAD.logical_not()

    def padded(t, keep, *args):
        return torch._nested_tensor_from_mask(t, keep, mask_check=False).to_padded_tensor(*args)
    for args in [(0.0,), (-1.0, (4, 5, 3)), (2.0, (5, 7, 4))]:
        want = padded(x, keep, *args)
        got = padded(x.to("tpu"), keep.to("tpu"), *args).cpu()
        assert torch.equal(got, want), args
    short = keep[:, :4].clone()  # no sequence longer than 3: padded to 3 without a size
    short[:, 3] = False
    assert torch.equal(padded(x[:, :4].to("tpu"), short.to("tpu"), 0.0).cpu(),
                       padded(x[:, :4], short, 0.0))


def test_nested_tensor_misuse_raises_as_eager_does():
    x, gaps = torch.randn(2, 3, 4), torch.tensor([[True, False, True], [True, True, True]])
    with pytest.raises(RuntimeError) as want:
        torch._nested_tensor_from_mask(x, gaps)
    with pytest.raises(RuntimeError, match=str(want.value)[:40]):
        torch._nested_tensor_from_mask(x.to("tpu"), gaps.to("tpu"))
    nested = torch._nested_tensor_from_mask(x.to("tpu"), gaps.to("tpu"), mask_check=False)
    with pytest.raises(NotImplementedError, match="aten.mul"):
        nested * 2
    with pytest.raises(RuntimeError):
        torch._nested_tensor_from_mask(x, gaps, mask_check=False).to_padded_tensor(0.0, (2, 1, 4))
    with pytest.raises(RuntimeError):
        nested.to_padded_tensor(0.0, (2, 1, 4))


def test_jagged_nested_tensor_of_tpu_values_trains_as_on_cpu(mode):
    # torch.nested.nested_tensor(..., layout=torch.jagged) of tpu tensors raised "Expected all
    # tensors to be on the same device, ... tpu:0 and meta": the tpu tensor's dispatch took an
    # op whose other argument was the jagged tensor's meta "dummy", which its own subclass
    # handles.
    torch.manual_seed(0)
    parts, linear = [torch.randn(3, 8), torch.randn(5, 8)], nn.Linear(8, 8)

    def run(device):
        linear.weight.grad = None
        nested = torch.nested.nested_tensor([p.to(device) for p in parts], layout=torch.jagged,
                                            requires_grad=True)
        out = torch.nn.functional.gelu(linear.to(device)(nested)).to_padded_tensor(0.0)
        out.sum().backward()
        return out.cpu(), linear.weight.grad.cpu()

    want = run("cpu")
    got = run("tpu")
    linear.to("cpu")
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cross", [False, True])
def test_attention_of_jagged_nested_tensors_on_tpu_matches_cpu(mode, cross):
    # PyTorch's jagged attention takes its math path off CUDA, through a strided-layout nested
    # tensor the device does not hold; the nested tensor's dispatch caught that error and
    # raised "If inputs are nested tensors they must be contiguous".
    torch.manual_seed(0)
    lengths, key_lengths = (3, 5, 1), (4, 2, 6)
    rows = [torch.randn(n, 16) for n in lengths]
    key_rows = [torch.randn(n, 16) for n in key_lengths] if cross else rows
    projections = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))

    def run(device):
        projections.to(device).zero_grad()
        x = torch.nested.nested_tensor([r.to(device) for r in rows], layout=torch.jagged,
                                       requires_grad=True)
        y = torch.nested.nested_tensor([r.to(device) for r in key_rows], layout=torch.jagged)
        q, k, v = (p(t).unflatten(-1, (2, 8)).transpose(1, 2)
                   for p, t in zip(projections, (x, y if cross else x, y if cross else x)))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        out = out.transpose(1, 2).flatten(-2)
        out.square().sum().backward()
        grads = [p.weight.grad.cpu() for p in projections]
        return [out.to_padded_tensor(0.0).cpu(), x.grad.to_padded_tensor(0.0).cpu(), *grads]

    want = run("cpu")
    got = run("tpu")
    projections.to("cpu")
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_causal_attention_of_jagged_nested_tensors_raises_as_on_cpu():
    parts = [torch.randn(3, 2, 4), torch.randn(5, 2, 4)]
    for device in ("cpu", "tpu"):
        q = torch.nested.nested_tensor([p.to(device) for p in parts],
                                       layout=torch.jagged).transpose(1, 2)
        with pytest.raises(RuntimeError, match="No viable backend"):
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
