"""Sine-wave prediction with stacked LSTMCells in float64, in the shape of pytorch/examples'
time_sequence_prediction, on generated sine waves.

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"

What it exercises: the model made float64 with ``.double()``, two ``nn.LSTMCell`` stepped over
the sequence by ``chunk(..., dim=1)`` with their states carried in Python, ``torch.cat`` of the
per-step outputs along dim 1, ``MSELoss``, ``optim.LBFGS`` driven by a closure that calls
``backward`` (several function evaluations per ``step``), then predicting ``future`` steps past
the input by feeding each output back as the next input, under ``no_grad``. ``main(device)``
runs it and returns what tests/migration/test_scripts.py compares against the same script on CPU.

Run it alone: ``python -m tests.migration.time_sequence_prediction tpu``.
"""
from __future__ import annotations

import sys

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim


class Sequence(nn.Module):
    def __init__(self, hidden=12):
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, input, future=0):
        outputs = []
        n = input.size(0)
        h_t = torch.zeros(n, self.hidden, dtype=torch.double, device=input.device)
        c_t = torch.zeros(n, self.hidden, dtype=torch.double, device=input.device)
        h_t2 = torch.zeros(n, self.hidden, dtype=torch.double, device=input.device)
        c_t2 = torch.zeros(n, self.hidden, dtype=torch.double, device=input.device)
        for input_t in input.chunk(input.size(1), dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for _ in range(future):   # feed the prediction back in
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


def make_waves(n=8, length=24, period=20, seed=2):
    rng = np.random.RandomState(seed)
    x = np.arange(length) + rng.randint(-4 * period, 4 * period, n).reshape(n, 1)
    return np.sin(x / period).astype("float64")


def main(device: str = "cuda", steps: int = 2, future: int = 6) -> dict:
    torch.manual_seed(0)
    data = make_waves()
    input = torch.from_numpy(data[2:, :-1]).to(device)
    target = torch.from_numpy(data[2:, 1:]).to(device)
    test_input = torch.from_numpy(data[:2, :-1]).to(device)
    test_target = torch.from_numpy(data[:2, 1:]).to(device)

    seq = Sequence().double().to(device)
    criterion = nn.MSELoss()
    optimizer = optim.LBFGS(seq.parameters(), lr=0.8, max_iter=4)
    losses, closure_losses = [], []
    for _ in range(steps):
        def closure():
            optimizer.zero_grad()
            out = seq(input)
            loss = criterion(out, target)
            closure_losses.append(loss.item())
            loss.backward()
            return loss
        losses.append(optimizer.step(closure).item())
        with torch.no_grad():
            pred = seq(test_input, future=future)
            test_loss = criterion(pred[:, :-future], test_target)
    return {"losses": losses, "closure_losses": closure_losses, "test_loss": test_loss.item(),
            "prediction": pred.cpu(),
            "model": {k: v.cpu() for k, v in seq.state_dict().items()},
            "lbfgs": {k: v.cpu() if isinstance(v, torch.Tensor) else v
                      for k, v in optimizer.state[optimizer._params[0]].items()
                      if k in ("d", "t", "n_iter", "prev_loss")}}


if __name__ == "__main__":
    result = main(*sys.argv[1:2])
    print(result["losses"], result["test_loss"])
