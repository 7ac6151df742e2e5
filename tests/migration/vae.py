"""A variational autoencoder, in the shape of pytorch/examples' vae, on random "MNIST-like"
images (no dataset, no torchvision).

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"

What it exercises: an encoder of ``Linear`` + ``ReLU`` giving ``mu`` and ``logvar``, the
reparameterization ``mu + eps * std`` with ``eps = torch.randn_like(std)``, a ``sigmoid``
decoder, ``F.binary_cross_entropy(..., reduction="sum")`` plus the KL term
``-0.5 * sum(1 + logvar - mu^2 - exp(logvar))``, ``Adam``, a test pass under ``no_grad`` with
``torch.cat`` of a few reconstructions beside their inputs, and samples decoded from the prior
(``torch.randn(..., device=device)``). ``main(device)`` runs it and returns what
tests/migration/test_scripts.py compares against the same script on CPU.

Run it alone: ``python -m tests.migration.vae tpu``.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn, optim

PIXELS, HIDDEN, LATENT = 64, 32, 4   # 8x8 "digits"


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(PIXELS, HIDDEN)
        self.fc21 = nn.Linear(HIDDEN, LATENT)
        self.fc22 = nn.Linear(HIDDEN, LATENT)
        self.fc3 = nn.Linear(LATENT, HIDDEN)
        self.fc4 = nn.Linear(HIDDEN, PIXELS)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, PIXELS))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, PIXELS), reduction="sum")
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return BCE + KLD


def main(device: str = "cuda", epochs: int = 2, batches: int = 3, batch_size: int = 8) -> dict:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    train = (torch.rand(batches, batch_size, 1, 8, 8, generator=g) > 0.6).float()
    test = (torch.rand(1, batch_size, 1, 8, 8, generator=g) > 0.6).float()
    model = VAE().to(device)
    torch.manual_seed(0)   # the device's generator too: the randn_like draws match CPU's
    optimizer = optim.Adam(model.parameters(), lr=1e-3)

    train_losses, test_losses = [], []
    for _epoch in range(epochs):
        model.train()
        train_loss = 0
        for data in train:
            data = data.to(device)
            optimizer.zero_grad()
            recon_batch, mu, logvar = model(data)
            loss = loss_function(recon_batch, data, mu, logvar)
            loss.backward()
            train_loss += loss.item()
            optimizer.step()
        train_losses.append(train_loss / (batches * batch_size))

        model.eval()
        test_loss = 0
        with torch.no_grad():
            for data in test:
                data = data.to(device)
                recon_batch, mu, logvar = model(data)
                test_loss += loss_function(recon_batch, data, mu, logvar).item()
                comparison = torch.cat([data[:4],
                                        recon_batch.view(batch_size, 1, 8, 8)[:4]])
        test_losses.append(test_loss / batch_size)
        with torch.no_grad():
            sample = torch.randn(4, LATENT, device=device)
            sample = model.decode(sample).cpu()
    return {"train_losses": train_losses, "test_losses": test_losses,
            "comparison": comparison.cpu(), "sample": sample,
            "model": {k: v.cpu() for k, v in model.state_dict().items()},
            "adam": [{k: v.cpu() for k, v in s.items()} for s in optimizer.state.values()]}


if __name__ == "__main__":
    result = main(*sys.argv[1:2])
    print(result["train_losses"], result["test_losses"])
