"""A plain CPU training script, as users write it: nothing in it mentions tpu.

tests/test_cpu_scripts_unchanged.py runs it with torchtpu autoloaded and with
TORCH_DEVICE_BACKEND_AUTOLOAD=0 and asserts the same output: installing torchtpu must not
change what a CPU-only script does. It prints one JSON line of results.
"""
import json

import torch
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(8, 16)
        self.block = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(),
                                         torch.nn.Dropout(0.2))
        self.out = torch.nn.Linear(16, 3)

    def forward(self, x, reentrant):
        h = self.inp(x).relu()
        h = checkpoint(self.block, h, use_reentrant=reentrant)
        return self.out(h)


def main():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(24, 8), torch.randint(0, 3, (24,)))
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    losses, batch_sums = [], []
    for epoch, workers in enumerate((0, 1)):
        loader = DataLoader(data, batch_size=8, shuffle=True, pin_memory=True,
                            num_workers=workers, generator=torch.Generator().manual_seed(epoch))
        for step, (x, y) in enumerate(loader):
            batch_sums.append(x.sum().item())
            x, y = x.to("cpu", non_blocking=True), y.to("cpu", non_blocking=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=step % 2 == 0):
                loss = torch.nn.functional.cross_entropy(model(x, reentrant=step == 1), y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
    print(json.dumps({
        "losses": losses,
        "batch_sums": batch_sums,
        "params": [p.double().sum().item() for p in model.parameters()],
        "lr": sched.get_last_lr(),
        "autocast_dtype": str(torch.get_autocast_dtype("cpu")),
        "rng_after": torch.rand(2).tolist(),
    }))


if __name__ == "__main__":
    main()
