"""The classic image-classification training loop, as CUDA users write it.

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"

Everything else is the CUDA script: DataLoader workers with ``pin_memory=True``,
``non_blocking=True`` copies, ``torch.autocast(device_type=device, ...)`` in bfloat16 or float16
with ``torch.amp.GradScaler(device)``, gradient accumulation, clipping after ``unscale_``, a
learning-rate scheduler, ``torch.save`` of model, optimizer, scaler and scheduler state, and a
resume with ``torch.load(..., map_location=device)``. ``main(device)`` runs it and returns what
tests/migration/test_scripts.py compares against the same script on CPU.

Run it alone: ``python -m tests.migration.image_classification tpu``.
"""
from __future__ import annotations

import os
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self, classes: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.drop = nn.Dropout(0.0)   # p=0: the tpu and CPU generators draw different masks
        self.fc = nn.Linear(16 * 2 * 2, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(self.drop(torch.flatten(x, 1)))


def train_epoch(model, loader, optimizer, scheduler, scaler, device, amp_dtype, accumulate):
    model.train()
    losses = []
    for i, (images, labels) in enumerate(loader):
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast(device_type=device, dtype=amp_dtype):
            output = model(images)
            loss = F.cross_entropy(output, labels) / accumulate
        scaler.scale(loss).backward()
        if (i + 1) % accumulate == 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
        losses.append(loss.item() * accumulate)
    return losses


@torch.no_grad()
def evaluate(model, loader, device):
    model.eval()
    correct = total = 0
    logits = []
    for images, labels in loader:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        output = model(images)
        logits.append(output.float().cpu())
        correct += (output.argmax(1) == labels).sum().item()
        total += labels.numel()
    return correct / total, torch.cat(logits)


def make(device, compiled):
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    run = torch.compile(model, backend="torchtpu") if compiled else model
    return model, run, optimizer, scheduler


def main(device: str = "cuda", amp: str = "bfloat16", compiled: bool = False,
         workers: int = 2, epochs: int = 2) -> dict:
    """Train ``epochs`` epochs, checkpoint, resume into fresh objects for one more epoch.

    Returns the losses, the parameters and eval logits (on CPU), and the scaler's scale.
    """
    torch.manual_seed(0)
    images, labels = torch.randn(48, 3, 8, 8), torch.randint(0, 4, (48,))
    train = TensorDataset(images, labels)
    loader = DataLoader(train, batch_size=8, shuffle=True, num_workers=workers,
                        pin_memory=True, generator=torch.Generator().manual_seed(0),
                        persistent_workers=workers > 0)
    test_loader = DataLoader(TensorDataset(images[:16], labels[:16]), batch_size=8,
                             pin_memory=True)
    amp_dtype = getattr(torch, amp)
    # GradScaler is for float16; with bfloat16 users leave it out (enabled=False).
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 10, growth_interval=3,
                                  enabled=amp_dtype == torch.float16)

    torch.manual_seed(1)
    model, run, optimizer, scheduler = make(device, compiled)
    losses = []
    for _ in range(epochs):
        losses += train_epoch(run, loader, optimizer, scheduler, scaler, device, amp_dtype,
                              accumulate=2)

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "checkpoint.pt")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                    "epoch": epochs}, path)
        # Resume: fresh objects, state from the file, one more epoch.
        model, run, optimizer, scheduler = make(device, compiled)
        scaler = torch.amp.GradScaler(device, enabled=amp_dtype == torch.float16)
        checkpoint = torch.load(path, map_location=device)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        scaler.load_state_dict(checkpoint["scaler"])
        losses += train_epoch(run, loader, optimizer, scheduler, scaler, device, amp_dtype,
                              accumulate=2)
        # The same file read onto the CPU, as one inspects a checkpoint elsewhere.
        on_cpu = torch.load(path, map_location="cpu")
    accuracy, logits = evaluate(run, test_loader, device)
    return {
        "losses": losses,
        "params": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "momentum": [optimizer.state[p]["momentum_buffer"].cpu() for p in model.parameters()],
        "logits": logits,
        "accuracy": accuracy,
        "scale": scaler.get_scale() if scaler.is_enabled() else None,
        "lr": scheduler.get_last_lr(),
        "checkpoint_devices": sorted({str(v.device) for v in on_cpu["model"].values()}),
        "checkpoint_params": on_cpu["model"],
    }


if __name__ == "__main__":
    result = main(*sys.argv[1:2])
    print("losses", [round(v, 4) for v in result["losses"]], "accuracy", result["accuracy"])
