"""A DCGAN, in the shape of PyTorch's DCGAN tutorial, on random "images" (no dataset).

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"

What it exercises: a generator of ``ConvTranspose2d`` + ``BatchNorm2d`` + ``ReLU`` ending in
``Tanh``, a discriminator of strided ``Conv2d`` + ``BatchNorm2d`` + ``LeakyReLU(0.2)`` ending in
``Sigmoid``, weights initialized through ``model.apply`` with ``nn.init.normal_`` and
``constant_``, ``BCELoss``, label tensors made with ``torch.full`` and refilled with ``fill_``,
the discriminator step on ``fake.detach()``, the generator step through the discriminator, two
``Adam`` optimizers with ``betas=(0.5, 0.999)``, ``D(x)``/``D(G(z))`` read with ``.mean().item()``,
and images from a fixed noise batch under ``no_grad``. ``main(device)`` runs it and returns what
tests/migration/test_scripts.py compares against the same script on CPU.

Run it alone: ``python -m tests.migration.dcgan tpu``.
"""
from __future__ import annotations

import sys

import torch
import torch.nn as nn

NZ, NGF, NDF, CHANNELS = 8, 4, 4, 3   # latent size, feature maps, image channels (16x16 images)
REAL, FAKE = 1.0, 0.0


def init_weights(m):
    name = type(m).__name__
    if "Conv" in name:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif "BatchNorm" in name:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(NZ, NGF * 4, 4, 1, 0, bias=False),          # 4x4
            nn.BatchNorm2d(NGF * 4), nn.ReLU(True),
            nn.ConvTranspose2d(NGF * 4, NGF * 2, 4, 2, 1, bias=False),     # 8x8
            nn.BatchNorm2d(NGF * 2), nn.ReLU(True),
            nn.ConvTranspose2d(NGF * 2, CHANNELS, 4, 2, 1, bias=False),    # 16x16
            nn.Tanh())

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(CHANNELS, NDF, 4, 2, 1, bias=False),                 # 8x8
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(NDF, NDF * 2, 4, 2, 1, bias=False),                  # 4x4
            nn.BatchNorm2d(NDF * 2), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(NDF * 2, 1, 4, 1, 0, bias=False),                    # 1x1
            nn.Sigmoid())

    def forward(self, x):
        return self.main(x)


def main(device: str = "cuda", steps: int = 3, batch_size: int = 8,
         compiled: bool = False) -> dict:
    torch.manual_seed(0)
    netG = Generator().to(device)
    netD = Discriminator().to(device)
    # Each device has its own generator, and building the modules drew from the host's: seeding
    # again here makes the device run's draws (init, noise) the CPU run's.
    torch.manual_seed(0)
    netG.apply(init_weights)
    netD.apply(init_weights)
    criterion = nn.BCELoss()
    if compiled:
        netG.compile(backend="torchtpu")   # in place: state_dict() keys stay the model's
        netD.compile(backend="torchtpu")
    fixed_noise = torch.randn(4, NZ, 1, 1, device=device)
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    g = torch.Generator().manual_seed(1)
    data = torch.rand(steps, batch_size, CHANNELS, 16, 16, generator=g) * 2 - 1

    history = {"loss_D": [], "loss_G": [], "D_x": [], "D_G_z1": [], "D_G_z2": []}
    for real_cpu in data:
        # (1) the discriminator: maximize log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        real = real_cpu.to(device)
        label = torch.full((real.size(0),), REAL, dtype=torch.float, device=device)
        output = netD(real).view(-1)
        errD_real = criterion(output, label)
        errD_real.backward()
        D_x = output.mean().item()

        noise = torch.randn(real.size(0), NZ, 1, 1, device=device)
        fake = netG(noise)
        label.fill_(FAKE)
        output = netD(fake.detach()).view(-1)
        errD_fake = criterion(output, label)
        errD_fake.backward()
        D_G_z1 = output.mean().item()
        errD = errD_real + errD_fake
        optimizerD.step()

        # (2) the generator: maximize log(D(G(z)))
        netG.zero_grad()
        label.fill_(REAL)   # fake labels are real for the generator's cost
        output = netD(fake).view(-1)
        errG = criterion(output, label)
        errG.backward()
        D_G_z2 = output.mean().item()
        optimizerG.step()

        for key, value in zip(history, (errD.item(), errG.item(), D_x, D_G_z1, D_G_z2)):
            history[key].append(value)

    with torch.no_grad():
        images = netG(fixed_noise).detach().cpu()
    return {
        **history,
        "images": images,
        "generator": {k: v.cpu() for k, v in netG.state_dict().items()},
        "discriminator": {k: v.cpu() for k, v in netD.state_dict().items()},
        "optimizerD": [{k: v.cpu() for k, v in s.items()} for s in optimizerD.state.values()],
    }


if __name__ == "__main__":
    result = main(*sys.argv[1:2])
    print(result["loss_D"], result["loss_G"])
