"""Optimizer steps on the eager tpu device, equal to eager CPU: fused steps
(``AdamW(fused=True)``, Hugging Face Trainer's default) computed on the device, no host
fallback, state updated in place; and with ``foreach=None``, optimizers and ``clip_grad_norm_``
on their multi-tensor path, as on CUDA (``torchtpu_eager/multi_tensor.py``)."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchtpu_compile
import torchtpu_eager  # noqa: F401  (registers the device; autoload does too)
from torchtpu_compile import config
from tests.support.helpers import train_side_by_side

TPU = torch.device("tpu", 0)


@pytest.fixture(autouse=True)
def strict_fp32():
    """fp32 matmuls as on CPU; strict: an op that would run on the host raises instead."""
    torchtpu_compile.reset_stats()
    with config.patch(matmul_precision="highest", strict=True):
        yield
    assert torchtpu_compile.stats()["eager_fallbacks"] == 0



def _models():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    dev = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    dev.load_state_dict(ref.state_dict())
    return ref, dev.to("tpu")


@pytest.mark.parametrize("optimizer", [
    # AdamW without amsgrad: an empty written list (max_exp_avg_sqs), the reported case.
    lambda p: torch.optim.AdamW(p, lr=0.01, eps=1e-3, weight_decay=0.1, fused=True),
    lambda p: torch.optim.Adam(p, lr=0.01, eps=1e-3, weight_decay=0.1, fused=True),
    lambda p: torch.optim.Adam(p, lr=0.01, eps=1e-3, amsgrad=True, maximize=True, fused=True),
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01,
                              fused=True),
    lambda p: torch.optim.SGD(p, lr=0.1, fused=True),   # no momentum: an empty buffer list
    lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.05, weight_decay=0.1, eps=1e-3,
                                  maximize=True, fused=True),
], ids=["adamw", "adam_weight_decay", "adam_amsgrad_maximize", "sgd_nesterov", "sgd_plain",
        "adagrad"])
def test_fused_optimizer_steps_match_cpu_on_the_device_in_place(optimizer, eager_mode):
    ref, dev = _models()
    opt_ref, opt_dev = optimizer(ref.parameters()), optimizer(dev.parameters())
    params = list(dev.parameters())
    x, y = torch.randn(5, 6), torch.randn(5, 2)
    states = []

    def remember_first_states(step):  # the state tensors after the first step, by identity
        if step == 0:
            states.extend(dict(opt_dev.state[p]) for p in params)
    train_side_by_side([(ref, opt_ref), (dev, opt_dev)], x, y, steps=3,
                       after_step=remember_first_states)
    assert list(dev.parameters()) == params and all(p is q for p, q in zip(dev.parameters(),
                                                                            params))
    for p_ref, p_dev, first in zip(ref.parameters(), params, states):
        assert p_dev.device == TPU
        torch.testing.assert_close(p_dev.detach().cpu(), p_ref.detach(), atol=1e-5, rtol=1e-4)
        for name, value in opt_ref.state[p_ref].items():
            current = opt_dev.state[p_dev][name]
            if isinstance(value, torch.Tensor):
                assert current is first[name], f"{name} was replaced, not updated in place"
                torch.testing.assert_close(current.cpu(), value, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("found_inf", [0.0, 1.0], ids=["finite", "found_inf"])
@pytest.mark.parametrize("op", [torch._fused_adamw_, torch._fused_adam_],
                         ids=["adamw", "adam"])
def test_fused_adam_unscales_gradients_and_skips_on_found_inf(op, found_inf):
    # GradScaler's path: the gradients are divided by grad_scale (and written back), and a
    # found inf leaves every tensor as it was.
    torch.manual_seed(0)
    shapes = [(4, 3), (3,)]
    cpu = [[torch.randn(s) for s in shapes] for _ in range(4)]
    cpu[3] = [v.abs() for v in cpu[3]]                      # exp_avg_sqs are non-negative
    steps = [torch.tensor(2.0) for _ in shapes]
    dev = [[t.to("tpu") for t in group] for group in cpu]
    dev_steps = [s.to("tpu") for s in steps]
    kwargs = dict(lr=0.01, beta1=0.9, beta2=0.999, weight_decay=0.1, eps=1e-8,
                  amsgrad=False, maximize=False)
    op(*cpu, [], steps, grad_scale=torch.tensor(4.0), found_inf=torch.tensor(found_inf),
       **kwargs)
    op(*dev, [], dev_steps, grad_scale=torch.tensor(4.0).to("tpu"),
       found_inf=torch.tensor(found_inf).to("tpu"), **kwargs)
    for group_cpu, group_dev in zip(cpu, dev):
        for t_cpu, t_dev in zip(group_cpu, group_dev):
            torch.testing.assert_close(t_dev.cpu(), t_cpu, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("found_inf", [0.0, 1.0], ids=["finite", "found_inf"])
@pytest.mark.parametrize("tensor_lr", [False, True], ids=["float_lr", "tensor_lr"])
def test_fused_adagrad_unscales_gradients_and_skips_on_found_inf(found_inf, tensor_lr):
    # As for Adam: grads divided by grad_scale and written back, nothing moves on a found inf;
    # the steps are read (Adagrad counts them outside the kernel), and a tensor lr is the
    # op's other overload.
    torch.manual_seed(0)
    shapes = [(4, 3), (3,)]
    cpu = [[torch.randn(s) for s in shapes] for _ in range(3)]
    cpu[2] = [v.abs() for v in cpu[2]]                      # state_sums are non-negative
    steps = [torch.tensor(3.0) for _ in shapes]
    dev = [[t.to("tpu") for t in group] for group in cpu]
    dev_steps = [s.to("tpu") for s in steps]
    kwargs = dict(lr_decay=0.1, weight_decay=0.1, eps=1e-10, maximize=False)
    lr = torch.tensor(0.05) if tensor_lr else 0.05
    torch._fused_adagrad_(*cpu, steps, lr=lr, grad_scale=torch.tensor(4.0),
                          found_inf=torch.tensor(found_inf), **kwargs)
    torch._fused_adagrad_(*dev, dev_steps, lr=lr.to("tpu") if tensor_lr else lr,
                          grad_scale=torch.tensor(4.0).to("tpu"),
                          found_inf=torch.tensor(found_inf).to("tpu"), **kwargs)
    for group_cpu, group_dev in zip([*cpu, steps], [*dev, dev_steps]):
        for t_cpu, t_dev in zip(group_cpu, group_dev):
            torch.testing.assert_close(t_dev.cpu(), t_cpu, atol=1e-6, rtol=1e-5)


def test_fused_adamw_keeps_low_precision_parameters_in_their_dtype():
    ref, dev = _models()
    ref.to(torch.bfloat16)
    dev.to(torch.bfloat16)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=0.01, fused=True)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=0.01, fused=True)
    x = torch.randn(5, 6, dtype=torch.bfloat16)
    for model, opt, inp in ((ref, opt_ref, x), (dev, opt_dev, x.to("tpu"))):
        model(inp).float().square().sum().backward()
        opt.step()
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        assert p_dev.dtype == torch.bfloat16
        # The forward and backward round differently in bf16; the step itself is float32.
        torch.testing.assert_close(p_dev.detach().cpu(), p_ref.detach(), atol=2e-2, rtol=2e-2)



@pytest.mark.parametrize("optimizer", [
    lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, fused=True),
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, fused=True),
    lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01, fused=True),
    lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),   # foreach, the tpu default
], ids=["adamw", "sgd", "adagrad", "adamw_foreach"])
def test_a_learning_rate_schedule_does_not_compile_a_step_per_learning_rate(optimizer):
    # Hugging Face Trainer's default: fused AdamW with a linear schedule, a new lr every step.
    # Each new lr compiled the whole update again (seconds per step on a real model).
    ref, dev = _models()
    opts = [optimizer(ref.parameters()), optimizer(dev.parameters())]
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, lambda step: 1.0 - 0.1 * step)
                 for o in opts]
    x, y = torch.randn(5, 6), torch.randn(5, 2)
    compiled = []
    train_side_by_side([(ref, opts[0], schedules[0]), (dev, opts[1], schedules[1])], x, y,
                       steps=5, after_step=lambda step: compiled.append(
                           torchtpu_compile.stats()["eager_programs_compiled"]))
    assert compiled[-1] == compiled[1], f"programs compiled after each step: {compiled}"
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.detach().cpu(), p_ref.detach(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("optimizer", [
    lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, fused=True),
    lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True, fused=True),
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1, fused=True),
], ids=["adamw", "adam_amsgrad", "sgd_dampening"])
def test_a_momentum_schedule_does_not_compile_a_step_per_momentum(optimizer):
    # OneCycleLR cycles Adam's beta1 (SGD's momentum) every step by default: 1 - beta1 and
    # beta1 ** step were constants of the program, so each step compiled the update again.
    ref, dev = _models()
    opts = [optimizer(ref.parameters()), optimizer(dev.parameters())]
    schedules = [torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.05, total_steps=10)
                 for o in opts]
    x, y = torch.randn(5, 6), torch.randn(5, 2)
    compiled = []
    train_side_by_side([(ref, opts[0], schedules[0]), (dev, opts[1], schedules[1])], x, y,
                       steps=6, after_step=lambda step: compiled.append(
                           torchtpu_compile.stats()["eager_programs_compiled"]))
    assert compiled[-1] == compiled[2], f"programs compiled after each step: {compiled}"
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.detach().cpu(), p_ref.detach(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("optimizer", [
    lambda ps: torch.optim.Adam(ps, lr=0.0123456789123, fused=True),
    lambda ps: torch.optim.AdamW(ps, lr=0.5, weight_decay=0.1, fused=True),
    lambda ps: torch.optim.Adagrad(ps, lr=0.0123456789123, lr_decay=0.1, fused=True),
])
def test_fused_steps_of_a_double_model_compute_in_double(optimizer):
    # The learning rate went to the device as float32 and the bias corrections were computed
    # from the float32 step count in float32: a float64 model drifted from CPU's in the 7th
    # digit, with no error.
    torch.manual_seed(0)
    p_cpu = torch.randn(6, dtype=torch.float64, requires_grad=True)
    p = p_cpu.detach().to("tpu").requires_grad_()
    opts = [optimizer([q]) for q in (p_cpu, p)]
    for _ in range(3):
        for q, opt in zip((p_cpu, p), opts):
            opt.zero_grad()
            (q * q.sin()).sum().backward()
            opt.step()
    torch.testing.assert_close(p.detach().cpu(), p_cpu.detach(), rtol=1e-14, atol=1e-14)


# --- foreach=None: the multi-tensor path, as on CUDA ------------------------------------------

class _OpNames(TorchDispatchMode):
    """The names of the ATen ops dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


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
