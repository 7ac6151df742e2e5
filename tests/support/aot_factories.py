"""Factories for the AOT tests and CLI: each returns (model, example_inputs)."""
import torch

from tests.support import zoo


def gpt2():
    model, (ids,) = zoo.gpt2()
    model.config.use_cache = False
    return model.eval(), (ids,)


def mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    return model.eval(), (torch.randn(5, 8),)


class BatchStats(torch.nn.Module):
    """Per-row softmax, a mean over the batch and the input itself: with a dynamic batch, the
    mean is wrong unless padding is masked and the outputs are wrong unless cut back."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l1 = torch.nn.Linear(8, 16)
        self.l2 = torch.nn.Linear(16, 3)

    def forward(self, x):
        h = torch.tanh(self.l1(x))
        return self.l2(h).softmax(-1), h.mean(0), x


def save_dynamic_batch_stats(path):
    """Export ``BatchStats`` with batch in 2..16 (buckets 8 and 16) to ``path``; returns
    (model, manifest)."""
    import torchtpu_compile.aot as aot
    model = BatchStats().eval()
    batch = torch.export.Dim("batch", min=2, max=16)
    artifact = aot.compile(model, (torch.randn(5, 8),), dynamic_shapes=({0: batch},),
                           precision="highest")
    artifact.save(str(path))
    return model, artifact.manifest
