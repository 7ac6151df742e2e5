"""The fused recurrent cells (torchtpu_compile/lower/decompositions/recurrent.py): nn.LSTM,
nn.GRU and their cells on the eager tpu device, strict (no host fallback), against the same
modules on the CPU (which never call the fused cells): outputs, every gradient."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tests.support.decomposition_checks import randn
from torchtpu_compile import config


def _run(make, inputs, device, use):
    torch.manual_seed(0)
    module = make().to(device)
    args = [x.detach().to(device).requires_grad_() for x in inputs]
    out = module(*args)
    use(out).backward()
    cpu = torch.utils._pytree.tree_map(lambda t: t.detach().cpu(), out)
    return cpu, [a.grad.cpu() for a in args], [p.grad.cpu() for p in module.parameters()]


def _weighted(t):
    """A sum of ``t`` that weighs each feature differently (a plain sum hides mixed-up gates)."""
    return (t * torch.linspace(-1, 1, t.shape[-1], device=t.device)).sum()


CASES = {
    # (module, inputs, what the loss reads)
    "lstm, h and c": (lambda: nn.LSTM(6, 5, batch_first=True),
                               [randn(3, 4, 6)],
                               lambda out: _weighted(out[0]) + out[1][1].sum()),
    "lstm without bias, only c": (lambda: nn.LSTM(6, 5, bias=False), [randn(4, 3, 6)],
                                  lambda out: out[1][1].pow(2).sum()),
    "gru bidirectional": (lambda: nn.GRU(6, 5, bidirectional=True), [randn(4, 3, 6)],
                          lambda out: _weighted(out[0])),
    "gru without bias": (lambda: nn.GRU(6, 5, bias=False), [randn(4, 3, 6)],
                         lambda out: out[1].pow(2).sum()),
    "lstm cell": (lambda: nn.LSTMCell(6, 5), [randn(3, 6)],
                  lambda out: _weighted(out[0]) + out[1].sum()),
    "gru cell, given a state": (lambda: nn.GRUCell(6, 5), [randn(3, 6), randn(3, 5, seed=1)],
                                lambda out: _weighted(out)),
}


# Stacked and projected layers (tests/slow/test_decompositions_full.py).
MORE_CASES = {
    "lstm 2 layers, projections, bidirectional": (
        lambda: nn.LSTM(6, 5, num_layers=2, proj_size=3, bidirectional=True), [randn(4, 2, 6)],
        lambda out: _weighted(out[0]) + out[1][1].sum()),
    "gru 2 layers, batch first": (lambda: nn.GRU(6, 5, num_layers=2, batch_first=True),
                                  [randn(3, 4, 6)], lambda out: _weighted(out[0])),
}


def check_recurrent(make, inputs, use):
    # The fused cells have CUDA kernels only: an LSTM or GRU on the tpu device raised
    # NotImplementedError (no host kernel to fall back to).
    expected = _run(make, inputs, "cpu", use)
    with config.patch(strict=True, matmul_precision="highest"):
        actual = _run(make, inputs, "tpu", use)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_recurrent_layers_on_the_device_match_the_cpu(name):
    check_recurrent(*CASES[name])


def test_a_packed_sequence_with_host_lengths():
    # PyTorch wants pack_padded_sequence's lengths on the host, with the data on any device
    # (CUDA scripts pass CPU lengths); on the tpu device it raised "Expected all tensors to be
    # on the same device". The op's device-generic kernel now runs, as on CUDA.
    lengths = torch.tensor([4, 4, 2])

    def packed_lstm(x):
        torch.manual_seed(0)
        lstm = nn.LSTM(6, 5, batch_first=True).to(x.device)  # the first case's cells
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
        out, _ = nn.utils.rnn.pad_packed_sequence(lstm(packed)[0], batch_first=True)
        _weighted(out).backward()
        return out.detach().cpu(), [p.grad.cpu() for p in lstm.parameters()]

    x = randn(3, 4, 6)
    with config.patch(strict=True, matmul_precision="highest"):
        actual = packed_lstm(x.to("tpu"))
    torch.testing.assert_close(actual, packed_lstm(x), rtol=1e-4, atol=1e-5)
