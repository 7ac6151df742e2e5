"""Sub-pixel super-resolution, in the shape of pytorch/examples' super_resolution, on random
low/high-resolution image pairs (no dataset).

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"

What it exercises: ``Conv2d`` layers with ``ReLU``, ``nn.init.orthogonal_`` with
``init.calculate_gain("relu")``, ``nn.PixelShuffle`` for the upscale, ``MSELoss``, ``Adam``,
PSNR as ``10 * log10(1 / mse.item())`` in a validation pass under ``no_grad``, and
``torch.compile(model, backend="torchtpu")`` when ``compiled``. ``main(device)`` runs it and
returns what tests/migration/test_scripts.py compares against the same script on CPU.

Run it alone: ``python -m tests.migration.super_resolution tpu``.
"""
from __future__ import annotations

import sys
from math import log10

import torch
import torch.nn as nn
import torch.nn.init as init
import torch.optim as optim


class Net(nn.Module):
    def __init__(self, upscale_factor):
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(1, 16, (5, 5), (1, 1), (2, 2))
        self.conv2 = nn.Conv2d(16, 16, (3, 3), (1, 1), (1, 1))
        self.conv3 = nn.Conv2d(16, 8, (3, 3), (1, 1), (1, 1))
        self.conv4 = nn.Conv2d(8, upscale_factor ** 2, (3, 3), (1, 1), (1, 1))
        self.pixel_shuffle = nn.PixelShuffle(upscale_factor)
        self._initialize_weights()

    def forward(self, x):
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        x = self.relu(self.conv3(x))
        return self.pixel_shuffle(self.conv4(x))

    def _initialize_weights(self):
        init.orthogonal_(self.conv1.weight, init.calculate_gain("relu"))
        init.orthogonal_(self.conv2.weight, init.calculate_gain("relu"))
        init.orthogonal_(self.conv3.weight, init.calculate_gain("relu"))
        init.orthogonal_(self.conv4.weight)


def make_pairs(n, batch_size, upscale, size=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    high = torch.rand(n, batch_size, 1, size * upscale, size * upscale, generator=g)
    low = nn.functional.avg_pool2d(high.flatten(0, 1), upscale).view(n, batch_size, 1, size, size)
    return list(zip(low, high))


def main(device: str = "cuda", epochs: int = 2, upscale_factor: int = 2,
         compiled: bool = False) -> dict:
    torch.manual_seed(0)
    train = make_pairs(3, 4, upscale_factor)
    test = make_pairs(1, 4, upscale_factor, seed=2)
    model = Net(upscale_factor=upscale_factor).to(device)
    if compiled:
        model = torch.compile(model, backend="torchtpu")
    criterion = nn.MSELoss()
    optimizer = optim.Adam(model.parameters(), lr=1e-3)

    losses, psnrs = [], []
    for _epoch in range(epochs):
        for input, target in train:
            input, target = input.to(device), target.to(device)
            optimizer.zero_grad()
            loss = criterion(model(input), target)
            losses.append(loss.item())
            loss.backward()
            optimizer.step()
        avg_psnr = 0
        with torch.no_grad():
            for input, target in test:
                input, target = input.to(device), target.to(device)
                mse = criterion(model(input), target)
                avg_psnr += 10 * log10(1 / mse.item())
        psnrs.append(avg_psnr / len(test))
    with torch.no_grad():
        out = model(test[0][0].to(device)).clamp(0, 1).cpu()
    return {"losses": losses, "psnr": psnrs, "output": out,
            "model": {k.removeprefix("_orig_mod."): v.cpu() for k, v in model.state_dict().items()}}


if __name__ == "__main__":
    result = main(*sys.argv[1:2])
    print(result["losses"], result["psnr"])
