"""A siamese network with a contrastive loss, in the shape of pytorch/examples'
siamese_network, and a forward-forward network trained layer by layer with local losses, in
the shape of pytorch/examples' mnist_forward_forward, on random "images" (no dataset).

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"

What it exercises: one tower applied to both images of a pair, ``F.pairwise_distance`` in a
contrastive loss ``(1 - y) d^2 + y clamp(margin - d, min=0)^2``, ``Adam`` with ``StepLR``, pair
prediction by thresholding the distance, ``torch.cdist`` between two embedded sets and
nearest neighbours by ``argmin``; then forward-forward: each ``Linear`` layer its own
``Adam``, inputs normalized by ``x / (x.norm(2, 1, keepdim=True) + 1e-4)``, the label
overlaid on the first pixels, a goodness ``h.pow(2).mean(1)`` pushed up on positive data and
down on negative data through ``log(1 + exp(...))``, the next layer fed ``detach()``-ed
outputs, and prediction by the label of the highest total goodness. ``main(device)`` runs it
and returns what tests/migration/test_scripts.py compares against the same script on CPU.

Run it alone: ``python -m tests.migration.siamese tpu``.
"""
from __future__ import annotations

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import StepLR

PIXELS, CLASSES = 36, 4   # 6x6 images


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.cnn = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(inplace=True),
                                 nn.MaxPool2d(2), nn.Conv2d(4, 8, 3), nn.ReLU(inplace=True))
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(8, 16), nn.ReLU(inplace=True),
                                nn.Linear(16, 4))

    def forward(self, x):
        return self.fc(self.cnn(x))


class SiameseNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.tower = Tower()

    def forward(self, input1, input2):
        return self.tower(input1), self.tower(input2)


def contrastive_loss(output1, output2, label, margin=2.0):
    distance = F.pairwise_distance(output1, output2, keepdim=True)
    return torch.mean((1 - label) * distance.pow(2)
                      + label * torch.clamp(margin - distance, min=0.0).pow(2))


class FFLayer(nn.Linear):
    def __init__(self, in_features, out_features, threshold=2.0, lr=0.03):
        super().__init__(in_features, out_features)
        self.relu = nn.ReLU()
        self.opt = torch.optim.Adam(self.parameters(), lr=lr)
        self.threshold = threshold

    def forward(self, x):
        x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))

    def train_layer(self, x_pos, x_neg, epochs):
        losses = []
        for _ in range(epochs):
            g_pos = self.forward(x_pos).pow(2).mean(1)
            g_neg = self.forward(x_neg).pow(2).mean(1)
            loss = torch.log(1 + torch.exp(torch.cat([-g_pos + self.threshold,
                                                      g_neg - self.threshold]))).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            losses.append(loss.item())
        return self.forward(x_pos).detach(), self.forward(x_neg).detach(), losses


def overlay_label(x, y):
    x_ = x.clone()
    x_[:, :CLASSES] *= 0.0
    x_[range(x.shape[0]), y] = x.max()
    return x_


def forward_forward(device, x, y, epochs=4):
    layers = [FFLayer(PIXELS, 24).to(device), FFLayer(24, 24).to(device)]
    torch.manual_seed(1)   # the device's generator too: the negative labels are CPU's
    x_pos = overlay_label(x, y)
    y_neg = (y + torch.randint(1, CLASSES, y.shape, device=device)) % CLASSES
    x_neg = overlay_label(x, y_neg)
    h_pos, h_neg, losses = x_pos, x_neg, []
    for layer in layers:
        h_pos, h_neg, layer_losses = layer.train_layer(h_pos, h_neg, epochs)
        losses.append(layer_losses)
    goodness_per_label = []
    for label in range(CLASSES):
        h = overlay_label(x, torch.full_like(y, label))
        goodness = []
        for layer in layers:
            h = layer(h)
            goodness.append(h.pow(2).mean(1))
        goodness_per_label.append(sum(goodness).unsqueeze(1))
    prediction = torch.cat(goodness_per_label, 1).argmax(1)
    return {"ff_losses": losses, "ff_error": 1.0 - prediction.eq(y).float().mean().item(),
            "ff_prediction": prediction.cpu(),
            "ff_layers": [{k: v.cpu() for k, v in layer.state_dict().items()} for layer in layers]}


def main(device: str = "cuda", epochs: int = 2, batches: int = 3, batch_size: int = 8) -> dict:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    prototypes = torch.rand(CLASSES, 1, 6, 6, generator=g)
    labels = torch.randint(CLASSES, (batches + 1, 2, batch_size), generator=g)
    images = prototypes[labels] + 0.3 * torch.randn(batches + 1, 2, batch_size, 1, 6, 6,
                                                      generator=g)
    model = SiameseNetwork().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = StepLR(optimizer, step_size=2, gamma=0.7)

    losses = []
    for _epoch in range(epochs):
        model.train()
        for b in range(batches):
            images_1, images_2 = images[b, 0].to(device), images[b, 1].to(device)
            targets = (labels[b, 0] != labels[b, 1]).float().unsqueeze(1).to(device)
            optimizer.zero_grad()
            output1, output2 = model(images_1, images_2)
            loss = contrastive_loss(output1, output2, targets)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        scheduler.step()

    model.eval()
    with torch.no_grad():
        images_1, images_2 = images[-1, 0].to(device), images[-1, 1].to(device)
        targets = (labels[-1, 0] != labels[-1, 1]).float().unsqueeze(1).to(device)
        output1, output2 = model(images_1, images_2)
        test_loss = contrastive_loss(output1, output2, targets).item()
        pred = (F.pairwise_distance(output1, output2) > 1.0).float()
        correct = pred.eq(targets.view_as(pred)).sum().item()
        distances = torch.cdist(output1, output2)
        nearest = distances.argmin(dim=1)

    torch.manual_seed(0)   # the forward-forward layers' init
    flat = images[:2].reshape(-1, PIXELS).to(device)
    ff = forward_forward(device, flat, labels[:2].reshape(-1).to(device))
    return {"losses": losses, "test_loss": test_loss, "correct": correct,
            "distances": distances.cpu(), "nearest": nearest.cpu(),
            "model": {k: v.cpu() for k, v in model.state_dict().items()}, **ff}


if __name__ == "__main__":
    result = main(*sys.argv[1:2])
    print(result["losses"], result["correct"], result["ff_error"])
