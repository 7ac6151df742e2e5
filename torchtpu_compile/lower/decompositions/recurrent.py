"""Recurrent cells: the fused LSTM and GRU cells and their backwards.

``nn.LSTM`` and ``nn.GRU`` (and ``nn.LSTMCell``/``nn.GRUCell``) call these on every device but
the CPU: PyTorch's recurrent layers do the two matmuls themselves and hand the gate
pre-activations to a fused cell, which only CUDA implements. Without them an LSTM or GRU on the
tpu device failed (the host has no kernel to fall back to). The semantics and the workspace
layouts follow CUDA's kernels (aten/src/ATen/native/cuda/RNN.cu): LSTM gates in the order
input, forget, cell, output, its workspace the four activated gates; GRU gates reset, update,
new, its workspace the three activated gates, the previous hidden state and the hidden part of
the new gate.

Example::

    table = decomposition_table()
    hy, cy, workspace = table[torch.ops.aten._thnn_fused_lstm_cell.default](
        input_gates, hidden_gates, cx, b_ih, b_hh)
"""
from __future__ import annotations

import torch

from .registry import decomposition

aten = torch.ops.aten


def _gates(input_gates, hidden_gates, input_bias, hidden_bias):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    return gates


@decomposition(aten._thnn_fused_lstm_cell.default)
def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    i, f, g, o = _gates(input_gates, hidden_gates, input_bias, hidden_bias).chunk(4, 1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    cy = f * cx + i * g
    hy = o * torch.tanh(cy)
    return hy, cy, torch.cat([i, f, g, o], 1)


@decomposition(aten._thnn_fused_lstm_cell_backward_impl.default)
def fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    # Either gradient may be undefined (only hy or only cy used): zeros.
    i, f, g, o = workspace.chunk(4, 1)
    grad_hy = torch.zeros_like(cy) if grad_hy is None else grad_hy
    tanh_cy = torch.tanh(cy)
    grad_c = grad_hy * o * (1 - tanh_cy * tanh_cy)
    if grad_cy is not None:
        grad_c = grad_c + grad_cy
    grad_gates = torch.cat([grad_c * g * (1 - i) * i, grad_c * cx * (1 - f) * f,
                            grad_c * i * (1 - g * g), grad_hy * tanh_cy * (1 - o) * o], 1)
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, grad_c * f, grad_bias


@decomposition(aten._thnn_fused_gru_cell.default)
def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    if input_bias is not None:
        input_gates, hidden_gates = input_gates + input_bias, hidden_gates + hidden_bias
    in_r, in_z, in_n = input_gates.chunk(3, 1)
    hid_r, hid_z, hid_n = hidden_gates.chunk(3, 1)
    r = torch.sigmoid(in_r + hid_r)
    z = torch.sigmoid(in_z + hid_z)
    n = torch.tanh(in_n + r * hid_n)
    return n + z * (hx - n), torch.cat([r, z, n, hx, hid_n], 1)


@decomposition(aten._thnn_fused_gru_cell_backward.default)
def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hid_n = workspace.chunk(5, 1)
    grad_z = grad_hy * (hx - n) * (1 - z) * z
    grad_in_n = grad_hy * (1 - z) * (1 - n * n)
    grad_r = grad_in_n * hid_n * (1 - r) * r
    grad_input_gates = torch.cat([grad_r, grad_z, grad_in_n], 1)
    grad_hidden_gates = torch.cat([grad_r, grad_z, grad_in_n * r], 1)
    if not has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hy * z, None, None
    return (grad_input_gates, grad_hidden_gates, grad_hy * z, grad_input_gates.sum(0),
            grad_hidden_gates.sum(0))
