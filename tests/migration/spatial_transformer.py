"""A spatial transformer network, in the shape of PyTorch's STN tutorial, on random 28x28
"digits" (no dataset).

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"

What it exercises: a localization network (``Conv2d``, ``MaxPool2d``, ``ReLU``) regressing a
2x3 affine matrix whose last layer starts at the identity (``weight.data.zero_()``,
``bias.data.copy_``), ``F.affine_grid`` and ``F.grid_sample`` warping the input, a classifier
with ``max_pool2d``, ``Dropout2d`` and ``F.dropout(training=self.training)``, ``log_softmax``
with ``nll_loss``, SGD, and an evaluation summing the loss (``reduction="sum"``) and counting
``output.max(1, keepdim=True)[1]`` matches with ``eq(...).sum().item()``. Dropout is on: each
device draws from its own generator, seeded alike by ``torch.manual_seed`` after the model is
built, so the CPU and device runs draw the same masks. ``main(device)`` runs it and returns what
tests/migration/test_scripts.py compares against the same script on CPU.

Run it alone: ``python -m tests.migration.spatial_transformer tpu``.
"""
from __future__ import annotations

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self, align_corners=True, dropout=0.5):
        super().__init__()
        self.align_corners = align_corners
        self.dropout = dropout
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d(dropout)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)
        self.localization = nn.Sequential(
            nn.Conv2d(1, 8, kernel_size=7), nn.MaxPool2d(2, stride=2), nn.ReLU(True),
            nn.Conv2d(8, 10, kernel_size=5), nn.MaxPool2d(2, stride=2), nn.ReLU(True))
        self.fc_loc = nn.Sequential(nn.Linear(10 * 3 * 3, 32), nn.ReLU(True), nn.Linear(32, 6))
        # Start from the identity transformation.
        self.fc_loc[2].weight.data.zero_()
        self.fc_loc[2].bias.data.copy_(torch.tensor([1, 0, 0, 0, 1, 0], dtype=torch.float))

    def stn(self, x):
        xs = self.localization(x).view(-1, 10 * 3 * 3)
        theta = self.fc_loc(xs).view(-1, 2, 3)
        grid = F.affine_grid(theta, x.size(), align_corners=self.align_corners)
        return F.grid_sample(x, grid, align_corners=self.align_corners)

    def forward(self, x):
        x = self.stn(x)
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = F.relu(self.fc1(x.view(-1, 320)))
        x = self.fc2(F.dropout(x, self.dropout, training=self.training))
        return F.log_softmax(x, dim=1)


def main(device: str = "cuda", steps: int = 3, batch_size: int = 8,
         align_corners: bool = True, dropout: float = 0.5, compiled: bool = False) -> dict:
    torch.manual_seed(0)
    model = Net(align_corners, dropout).to(device)
    if compiled:
        model.compile(backend="torchtpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    g = torch.Generator().manual_seed(1)
    images = torch.rand(steps + 1, batch_size, 1, 28, 28, generator=g)
    labels = torch.randint(0, 10, (steps + 1, batch_size), generator=g)
    torch.manual_seed(0)   # the dropout masks: see the docstring

    model.train()
    losses = []
    for data, target in zip(images[:steps], labels[:steps]):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    model.eval()
    with torch.no_grad():
        data, target = images[steps].to(device), labels[steps].to(device)
        output = model(data)
        test_loss = F.nll_loss(output, target, reduction="sum").item()
        pred = output.max(1, keepdim=True)[1]
        correct = pred.eq(target.view_as(pred)).sum().item()
        warped = model.stn(data).cpu()
    return {
        "losses": losses,
        "test_loss": test_loss,
        "correct": correct,
        "warped": warped,
        "model": {k: v.cpu() for k, v in model.state_dict().items()},
    }


if __name__ == "__main__":
    result = main(*sys.argv[1:2])
    print(result["losses"], result["test_loss"], result["correct"])
