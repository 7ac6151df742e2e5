"""Optimizers and ``clip_grad_norm_`` with ``foreach=None`` take the multi-tensor path on tpu
tensors, as on CUDA (``torchtpu_eager/multi_tensor.py``), with CPU's results."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchtpu_compile
import torchtpu_eager  # noqa: F401  (registers the device; autoload does too)
from torchtpu_compile import config
from tests.support.helpers import train_side_by_side


@pytest.fixture(autouse=True)
def strict_fp32():
    """fp32 matmuls as on CPU; strict: an op that would run on the host raises instead."""
    torchtpu_compile.reset_stats()
    with config.patch(matmul_precision="highest", strict=True):
        yield
    assert torchtpu_compile.stats()["eager_fallbacks"] == 0


@pytest.fixture(params=["strict", "defer_and_fuse"])
def eager_mode(request):
    saved = torch.tpu.get_eager_mode()
    torch.tpu.set_eager_mode(request.param)
    yield request.param
    torch.tpu.set_eager_mode(saved)


class _OpNames(TorchDispatchMode):
    """The names of the ATen ops dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _models():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    dev = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    dev.load_state_dict(ref.state_dict())
    return ref, dev.to("tpu")


OPTIMIZERS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1),
    "adamw_amsgrad": lambda p: torch.optim.AdamW(p, lr=0.01, amsgrad=True),
    "rmsprop_centered": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1),
    "nadam": lambda p: torch.optim.NAdam(p, lr=0.01),
}


@pytest.mark.parametrize("make", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_default_optimizer_steps_are_multi_tensor_with_cpu_results(make, eager_mode):
    ref, dev = _models()
    opt_ref, opt_dev = make(ref.parameters()), make(dev.parameters())
    x, y = torch.randn(5, 6), torch.randn(5, 2)
    train_side_by_side([(ref, opt_ref), (dev, opt_dev)], x, y, steps=2)
    with _OpNames() as seen:
        opt_dev.step()
    opt_ref.step()
    # CUDA's default: the whole model's update in _foreach_* ops, not a loop over parameters.
    assert any(name.startswith("_foreach_") for name in seen.names), seen.names
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.detach().cpu(), p_ref.detach(), atol=1e-5, rtol=1e-4)


def test_clip_grad_norm_is_multi_tensor_with_cpu_results(eager_mode):
    ref, dev = _models()
    x, y = torch.randn(5, 6), torch.randn(5, 2)
    for model in (ref, dev):
        device = next(model.parameters()).device
        torch.nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()
    with _OpNames() as seen:
        norm_dev = torch.nn.utils.clip_grad_norm_(dev.parameters(), 0.1)
    norm_ref = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1)
    assert "_foreach_norm" in seen.names, seen.names
    torch.testing.assert_close(norm_dev.cpu(), norm_ref, atol=1e-6, rtol=1e-5)
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.grad.cpu(), p_ref.grad, atol=1e-6, rtol=1e-5)


def test_foreach_false_and_cpu_tensors_keep_the_loop():
    from torch.optim.optimizer import _default_to_fused_or_foreach
    cpu = list(torch.nn.Linear(3, 3).parameters())
    assert _default_to_fused_or_foreach(cpu, False) == (False, False)   # CPU: PyTorch's default
    _, dev = _models()
    opt = torch.optim.SGD(dev.parameters(), lr=0.1, momentum=0.9, foreach=False)
    torch.nn.functional.mse_loss(dev(torch.randn(5, 6).to("tpu")),
                                 torch.randn(5, 2).to("tpu")).backward()
    with _OpNames() as seen:
        opt.step()
    assert not any(name.startswith("_foreach_") for name in seen.names), seen.names
