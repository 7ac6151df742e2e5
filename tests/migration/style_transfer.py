"""Neural style transfer, in the shape of PyTorch's neural style tutorial, on random images and
a small randomly initialized CNN standing for VGG's features (no download).

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"

What it exercises: the image itself as the optimized tensor (``requires_grad_(True)``, the
network's own parameters frozen with ``requires_grad_(False)``), a feature network rebuilt
child by child (``children()``, ``isinstance`` per layer, ``ReLU(inplace=False)`` in place of
in-place ones) with a normalization module and content/style loss modules inserted after
chosen convolutions, then cut after the last loss, Gram matrices (``view``, ``mm`` with ``t()``,
``div``), ``F.mse_loss`` against detached targets, a forward hook recording a layer's mean
activation, ``LBFGS`` stepping a closure that first clamps the image under ``no_grad``
(``clamp_``), and a final ``clamp_``. ``main(device)`` runs it and returns what
tests/migration/test_scripts.py compares against the same script on CPU.

Run it alone: ``python -m tests.migration.style_transfer tpu``.
"""
from __future__ import annotations

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


def gram_matrix(x):
    a, b, c, d = x.size()   # batch, feature maps, height, width
    features = x.view(a * b, c * d)
    return torch.mm(features, features.t()).div(a * b * c * d)


class ContentLoss(nn.Module):
    def __init__(self, target):
        super().__init__()
        self.target = target.detach()

    def forward(self, x):
        self.loss = F.mse_loss(x, self.target)
        return x


class StyleLoss(nn.Module):
    def __init__(self, target_feature):
        super().__init__()
        self.target = gram_matrix(target_feature).detach()

    def forward(self, x):
        self.loss = F.mse_loss(gram_matrix(x), self.target)
        return x


class Normalization(nn.Module):
    def __init__(self, mean, std):
        super().__init__()
        self.mean = mean.clone().detach().view(-1, 1, 1)
        self.std = std.clone().detach().view(-1, 1, 1)

    def forward(self, img):
        return (img - self.mean) / self.std


def feature_network():
    """A small stand-in for VGG19's ``features``: convolutions, in-place ReLUs, max pools."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(inplace=True))


def style_model_and_losses(cnn, mean, std, style_img, content_img,
                           content_layers=("conv_3",), style_layers=("conv_1", "conv_2", "conv_4")):
    model = nn.Sequential(Normalization(mean, std))
    content_losses, style_losses = [], []
    i = 0
    for layer in cnn.children():
        if isinstance(layer, nn.Conv2d):
            i += 1
            name = f"conv_{i}"
        elif isinstance(layer, nn.ReLU):
            name = f"relu_{i}"
            layer = nn.ReLU(inplace=False)   # in-place ReLUs would change what the losses saw
        elif isinstance(layer, nn.MaxPool2d):
            name = f"pool_{i}"
        else:
            raise RuntimeError(f"Unrecognized layer: {layer.__class__.__name__}")
        model.add_module(name, layer)
        if name in content_layers:
            loss = ContentLoss(model(content_img).detach())
            model.add_module(f"content_loss_{i}", loss)
            content_losses.append(loss)
        if name in style_layers:
            loss = StyleLoss(model(style_img).detach())
            model.add_module(f"style_loss_{i}", loss)
            style_losses.append(loss)
    # Cut the layers after the last loss.
    for last in range(len(model) - 1, -1, -1):
        if isinstance(model[last], (ContentLoss, StyleLoss)):
            break
    return model[:last + 1], style_losses, content_losses


def run_style_transfer(cnn, mean, std, content_img, style_img, input_img, num_steps,
                       style_weight=1e4, content_weight=1):
    model, style_losses, content_losses = style_model_and_losses(cnn, mean, std, style_img,
                                                                 content_img)
    input_img.requires_grad_(True)
    model.eval()
    model.requires_grad_(False)
    activations = []
    model.relu_2.register_forward_hook(
        lambda module, inputs, output: activations.append(output.detach().mean()))
    optimizer = torch.optim.LBFGS([input_img])
    scores = []
    run = [0]
    while run[0] <= num_steps:
        def closure():
            with torch.no_grad():
                input_img.clamp_(0, 1)
            optimizer.zero_grad()
            model(input_img)
            style_score = sum(sl.loss for sl in style_losses) * style_weight
            content_score = sum(cl.loss for cl in content_losses) * content_weight
            loss = style_score + content_score
            loss.backward()
            run[0] += 1
            scores.append((style_score.item(), content_score.item()))
            return style_score + content_score

        optimizer.step(closure)
    with torch.no_grad():
        input_img.clamp_(0, 1)
    return input_img, scores, torch.stack(activations)


def main(device: str = "cuda", num_steps: int = 6, size: int = 16) -> dict:
    torch.manual_seed(0)
    cnn = feature_network().to(device).eval()
    mean = torch.tensor([0.485, 0.456, 0.406]).to(device)
    std = torch.tensor([0.229, 0.224, 0.225]).to(device)
    style_img = torch.rand(1, 3, size, size).to(device)
    content_img = torch.rand(1, 3, size, size).to(device)
    input_img = content_img.clone()
    output, scores, activations = run_style_transfer(cnn, mean, std, content_img, style_img,
                                                     input_img, num_steps)
    return {"scores": scores, "output": output.detach().cpu(), "activations": activations.cpu()}


if __name__ == "__main__":
    print(main(*sys.argv[1:2])["scores"])
