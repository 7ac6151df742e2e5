"""``Module.to("tpu")`` keeps Parameter objects, hence tied weights, as CUDA's ``.to`` does."""
import pytest
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


def test_to_empty_keeps_ties_and_parameters_as_on_cpu():
    # to_empty(device="tpu") took PyTorch's plain _apply: a new Parameter for each, the LM
    # head and its embedding two parameters that trained apart
    for device in ("cpu", "tpu"):
        model = Tied()
        weight = model.embed.weight
        model.to_empty(device=device)
        assert model.embed.weight is weight is model.head.weight
        assert weight.device.type == device and len(list(model.parameters())) == 1


def test_parameters_keep_their_attributes_and_hooks_both_ways():
    # The swap that keeps a Parameter object swapped its Python attributes and its tensor
    # hooks out with the old tensor: on CUDA (param.data = ...) both stay.
    results = {}
    for device in ("cpu", "tpu"):
        linear, fired = torch.nn.Linear(3, 2), []
        linear.weight.sharded = True
        linear.weight.register_hook(lambda grad, fired=fired: fired.append("hook") or grad * 2)
        linear.weight.register_post_accumulate_grad_hook(
            lambda p, fired=fired: fired.append("post"))
        linear.to(device)
        linear(torch.ones(1, 3, device=device)).sum().backward()
        linear.cpu()
        linear(torch.ones(1, 3)).sum().backward()
        results[device] = (getattr(linear.weight, "sharded", None), fired,
                           linear.weight.grad.cpu())
    assert results["tpu"][:2] == results["cpu"][:2] == (True, ["hook", "post"] * 2)
    torch.testing.assert_close(results["tpu"][2], results["cpu"][2])


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


class TiedRNN(torch.nn.Module):
    # pytorch/examples' word_language_model: an RNN between a tied embedding and decoder.
    def __init__(self, kind):
        super().__init__()
        self.encoder = torch.nn.Embedding(7, 4)
        self.rnn = getattr(torch.nn, kind)(4, 4)
        self.decoder = torch.nn.Linear(4, 7)
        self.decoder.weight = self.encoder.weight

    def forward(self, idx):
        out, _ = self.rnn(self.encoder(idx))
        return self.decoder(out)


def test_a_model_with_an_rnn_keeps_its_tied_weights_and_parameters():
    # nn.LSTM/GRU/RNN keep weak references to their weights (_flat_weight_refs), which
    # RNNBase._apply drops before converting; the move used to see them, refuse to swap, and
    # untie the embedding from the decoder (with a warning).
    for kind in ("GRU", "RNN", "LSTM"):
        torch.manual_seed(0)
        model = TiedRNN(kind)
        weights = dict(model.named_parameters())
        model.to("tpu")
        assert model.decoder.weight is model.encoder.weight, kind
        assert dict(model.named_parameters()) == weights, kind
        assert all(p.device.type == "tpu" for p in model.parameters())
        assert all(w is getattr(model.rnn, n)     # the RNN's own list follows the move
                   for w, n in zip(model.rnn._flat_weights, model.rnn._flat_weights_names))
    # An optimizer built before the move steps the moved (tpu) weights.
    optimizer = torch.optim.SGD(weights.values(), lr=1.0)
    before = model.decoder.weight.detach().cpu()
    model.encoder.weight.grad = torch.ones(7, 4, device="tpu")
    optimizer.step()
    torch.testing.assert_close(model.decoder.weight.detach().cpu(), before - 1)
    model.to("cpu")
    assert model.decoder.weight is model.encoder.weight
    assert dict(model.named_parameters()) == weights


def test_module_cpu_brings_a_tpu_model_back_keeping_its_parameters():
    # CUDA's model.cpu() keeps each Parameter (and so tied weights), as model.to("cpu") does;
    # on tpu it made new Parameters and untied them.
    model = Tied().to("tpu")
    weight = model.embed.weight
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    assert model.cpu() is model
    assert model.embed.weight is weight is model.head.weight and weight.device.type == "cpu"
    before = weight.detach().clone()
    model(torch.tensor([[0, 3]])).sum().backward()
    optimizer.step()
    assert not torch.equal(weight.detach(), before)


def test_lazy_modules_moved_before_their_first_forward_initialize_and_train_as_on_cpu():
    # nn.LazyLinear(3).to("tpu") (the CUDA idiom) turned the uninitialized weight into a
    # zero-size tpu tensor that the module took for initialized: its first forward failed.
    def run(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.LazyConv1d(3, 2), torch.nn.LazyBatchNorm1d(),
                                    torch.nn.Flatten(), torch.nn.LazyLinear(2)).to(device)
        x = torch.randn(4, 2, 5).to(device)
        with config.patch(matmul_precision="highest"):
            out = model(x)
            out.square().sum().backward()
        assert all(p.device.type == device for p in model.parameters())
        return [out.detach().cpu(), *(p.grad.cpu() for p in model.parameters()),
                *(b.cpu() for b in model.buffers())]
    expected, actual = run("cpu"), run("tpu")
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("target", ["meta", "cpu", "tpu"])
def test_a_parameter_rebuilt_from_its_type_is_a_parameter_as_on_cuda(target):
    # Code that rebuilds a parameter as `type(p)(data, requires_grad=...)` (accelerate's
    # offload hooks, from_pretrained with a device_map that offloads to the CPU) gets
    # nn.Parameter on CUDA; a tpu parameter's type is the tpu tensor type (PyTorch keeps a
    # tensor subclass's type and marks it a parameter), whose constructor refused the call.
    weight = torch.nn.Linear(2, 3).to("tpu").weight
    data = weight.detach().to(target)
    rebuilt = type(weight)(data, requires_grad=False)
    assert isinstance(rebuilt, torch.nn.Parameter) and not rebuilt.requires_grad
    assert rebuilt.device.type == target and type(rebuilt) is type(torch.nn.Parameter(data))
    if target != "meta":
        torch.testing.assert_close(rebuilt.cpu(), weight.detach().cpu())
    assert type(weight)(data).requires_grad   # Parameter's default


def test_accelerate_offloads_a_tpu_parameter_to_meta_and_back():
    # The exact calls accelerate's AlignDevicesHook makes around each offloaded module's
    # forward: weights in from the CPU copy before, out to "meta" after.
    from accelerate.utils import set_module_tensor_to_device
    torch.manual_seed(0)
    cpu = torch.nn.Linear(2, 3)
    layer = torch.nn.Linear(2, 3).to("tpu")
    for name, value in cpu.named_parameters():
        set_module_tensor_to_device(layer, name, "tpu", value=value.detach())
    x = torch.randn(4, 2)
    with config.patch(matmul_precision="highest"):
        torch.testing.assert_close(layer(x.to("tpu")).cpu(), cpu(x))
    for name in ("weight", "bias"):
        set_module_tensor_to_device(layer, name, "meta")
    assert {(p.device.type, type(p)) for p in layer.parameters()} == {
        ("meta", torch.nn.Parameter)}


class TwoTiedLinears(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 3, bias=False)
        self.b = torch.nn.Linear(3, 3)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(self.a(x))


@pytest.mark.parametrize("make", ["script", "trace"])
def test_a_scripted_model_keeps_its_parameters_and_ties_and_trains_as_on_cpu(make):
    # Its C++ module holds each parameter too: the conversion made new Parameters, so an
    # optimizer built before .to("tpu") trained nothing and a tie came apart (silently).
    x = torch.ones(2, 3)
    results = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        model = TwoTiedLinears()
        model = torch.jit.script(model) if make == "script" else torch.jit.trace(model, x)
        before = list(model.parameters())
        optimizer = torch.optim.SGD(before, lr=0.5)
        model.to(device)
        assert list(model.parameters()) == before and model.a.weight is model.b.weight
        for _ in range(3):
            optimizer.zero_grad()
            with config.patch(matmul_precision="highest"):
                model(x.to(device)).square().mean().backward()
            optimizer.step()
        results[device] = [p.detach().cpu() for p in model.parameters()]
    torch.testing.assert_close(results["tpu"], results["cpu"])


def test_a_loaded_torchscript_model_moves_to_the_device(tmp_path):
    # torch.jit.load's parameters are plain tensors, which the conversion refused ("param must
    # be a Parameter") where CUDA assigns their .data.
    torch.manual_seed(0)
    torch.jit.save(torch.jit.script(TwoTiedLinears()), tmp_path / "m.pt")
    model = torch.jit.load(tmp_path / "m.pt")
    x = torch.randn(2, 3)
    want = model(x)
    model.to("tpu")
    assert all(p.device.type == "tpu" for p in model.parameters())
    with config.patch(matmul_precision="highest"):
        torch.testing.assert_close(model(x.to("tpu")).cpu(), want)


def test_a_scripted_model_on_the_device_saves_and_loads_on_the_cpu(tmp_path):
    # TorchScript's serializer views each parameter's whole storage (set_ to the tensor's own
    # storage), which the device refused: "set the storage of a tensor on device tpu:0 to a
    # storage on different device tpu:0".
    torch.manual_seed(0)
    model = TwoTiedLinears()
    x = torch.randn(2, 3)
    want = model(x)
    for make in (torch.jit.script, lambda m: torch.jit.trace(m, x.to("tpu"))):
        torch.jit.save(make(model.to("tpu")), tmp_path / "m.pt")
        loaded = torch.jit.load(tmp_path / "m.pt", map_location="cpu")
        with config.patch(matmul_precision="highest"):
            torch.testing.assert_close(loaded(x), want)
        model.cpu()


@pytest.mark.parametrize("build", ["device_argument", "device_context"])
def test_lazy_modules_built_for_the_device_initialize_there_as_on_cpu(build):
    # A tpu tensor cannot be an UninitializedParameter: nn.LazyLinear(4, device="tpu") (and
    # any lazy module under `with torch.device("tpu")`) raised in _make_subclass.
    def make(device):
        if build == "device_argument":
            return torch.nn.Sequential(torch.nn.LazyConv2d(3, 3, device=device),
                                       torch.nn.LazyBatchNorm2d(device=device),
                                       torch.nn.Flatten(), torch.nn.LazyLinear(4, device=device))
        with torch.device(device):
            return torch.nn.Sequential(torch.nn.LazyConv2d(3, 3), torch.nn.LazyBatchNorm2d(),
                                       torch.nn.Flatten(), torch.nn.LazyLinear(4))

    x = torch.randn(2, 5, 6, 6)
    results = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        model = make(device)
        with config.patch(matmul_precision="highest"):
            out = model(x.to(device))
            out.square().sum().backward()
        assert all(p.device.type == device for p in model.parameters())
        results[device] = [out.detach().cpu()] + [p.grad.cpu() for p in model.parameters()]
    torch.testing.assert_close(results["tpu"], results["cpu"])
