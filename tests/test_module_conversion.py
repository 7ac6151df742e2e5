"""``Module.to("tpu")`` keeps Parameter objects, hence tied weights, as CUDA's ``.to`` does."""
import torch

import torchtpu_eager  # noqa: F401  (registers the device; autoload does too)
from torchtpu_compile import config


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(6, 4)
        self.head = torch.nn.Linear(4, 6, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx):
        return self.head(self.embed(idx))


def test_tied_weights_stay_tied_and_train_as_on_cpu():
    results = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        model = Tied().to(device)
        assert model.head.weight is model.embed.weight
        assert len(list(model.parameters())) == 1
        with config.patch(matmul_precision="highest"):
            model(torch.tensor([[1, 2, 2]]).to(device)).square().sum().backward()
        results[device] = model.embed.weight.grad.cpu()
    torch.testing.assert_close(results["tpu"], results["cpu"])


def test_parameters_keep_their_identity_both_ways():
    torch.manual_seed(0)
    model = Tied()
    weight = model.embed.weight
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)   # built before the move, as users do
    model.tpu()
    assert model.embed.weight is weight and weight.device.type == "tpu"
    model(torch.tensor([[0]]).to("tpu")).sum().backward()
    before = weight.detach().cpu().clone()
    optimizer.step()
    assert not torch.equal(weight.detach().cpu(), before)
    model.to("cpu")
    assert model.embed.weight is weight is model.head.weight and weight.device.type == "cpu"


def test_cpu_conversions_are_untouched():
    model = Tied()
    assert not torch.__future__.get_swap_module_params_on_conversion()
    weight = model.embed.weight
    model.to(torch.float64)
    assert model.embed.weight is weight and weight.dtype == torch.float64
    assert not torch.__future__.get_swap_module_params_on_conversion()


def test_moving_a_model_while_its_graph_is_alive_works_as_before():
    # Swapping needs the parameters held by nothing else; an output whose autograd graph
    # saved the weights holds them. Moving then must still work, as it does on CUDA.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(5, 3)
    expected = model(x)
    model.to("tpu")
    with config.patch(matmul_precision="highest"):
        out = model(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), expected)
    model.cpu()
    assert all(p.device.type == "cpu" for p in model.parameters())
    torch.testing.assert_close(model(x), expected)
    out.sum().backward()  # the tpu graph still runs backward on its own parameters
