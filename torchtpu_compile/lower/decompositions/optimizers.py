"""The fused optimizer steps (``AdamW(fused=True)``, ``Adam(fused=True)``, ``SGD(fused=True)``,
``Adagrad(fused=True)``) as plain elementwise math per parameter, so that the step runs on the
device.

Functionalization turns ``_fused_adamw_`` into its functional twin ``_fused_adamw``, which
torch-mlir does not lower. Written per tensor, the update lowers, and XLA fuses the whole list
into one program. The math follows PyTorch's CPU kernels: low-precision tensors computed in
float32 and rounded once; ``grad_scale`` divides the gradients (and the unscaled gradients are
written back); ``found_inf`` equal to 1 leaves every tensor as it was.

Example::

    table = decomposition_table()
    params, grads, exp_avgs, exp_avg_sqs, _ = table[torch.ops.aten._fused_adamw.default](
        [p], [g], [m], [v], [], [step], lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.01,
        eps=1e-8, amsgrad=False, maximize=False)
"""
from __future__ import annotations

import torch

from .registry import decomposition

aten = torch.ops.aten


def _opmath(t):
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _step(step, p):
    # The step count is a float32 tensor; PyTorch's CPU kernels compute the step's bias
    # corrections in double, so a float64 model's are float64 (float32 ones were wrong in the
    # 7th digit); others keep the device's float32.
    return step.to(p.dtype) if p.dtype == torch.float64 else step


def _unscaled(grad, grad_scale):
    return grad if grad_scale is None else grad / grad_scale


def _liftable(step, value):
    """``value`` (a float) as a tensor computed from ``step``. A schedule that cycles momentum
    (OneCycleLR's default) passes new betas every step; as Python floats, ``1 - beta1`` and
    ``beta1 ** step`` were constants derived from them, which scalars.py cannot lift into a
    program input, so the eager device compiled the whole update again each step. Added to a
    value of an input (a constant would be folded back into ``1 - beta1``), the float sits
    where it can be lifted."""
    return step * 0 + value


def _unless_found_inf(found_inf, new: list, old: list) -> list:
    """``new``, or ``old`` where ``found_inf`` is 1 (GradScaler found an inf: no step)."""
    if found_inf is None:
        return new
    skip = found_inf == 1.0
    return [torch.where(skip, o, n) for n, o in zip(new, old)]


def _adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
          beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None,
          decoupled):
    outs = ([], [], [], [], [])
    for i, param in enumerate(params):
        grad = _opmath(_unscaled(grads[i], grad_scale))
        p, m, v = _opmath(param), _opmath(exp_avgs[i]), _opmath(exp_avg_sqs[i])
        step = _step(state_steps[i], p)
        b1, b2 = _liftable(step, beta1), _liftable(step, beta2)
        g = -grad if maximize else grad
        if weight_decay != 0:
            if decoupled:   # AdamW: the decay scales the parameter
                p = p - p * (lr * weight_decay)
            else:           # Adam: the decay is added to the gradient
                g = g + p * weight_decay
        m = m * b1 + g * (1 - b1)
        v = v * b2 + g * g * (1 - b2)
        bias_correction1 = 1 - torch.pow(b1, step)
        bias_correction2_sqrt = torch.sqrt(1 - torch.pow(b2, step))
        if amsgrad:
            v_max = torch.maximum(_opmath(max_exp_avg_sqs[i]), v)
            denom = torch.sqrt(v_max) / bias_correction2_sqrt + eps
        else:
            denom = torch.sqrt(v) / bias_correction2_sqrt + eps
        p = p - (lr / bias_correction1) * m / denom
        new = [p.to(param.dtype), grad.to(grads[i].dtype), m.to(exp_avgs[i].dtype),
               v.to(exp_avg_sqs[i].dtype)]
        old = [param, grads[i], exp_avgs[i], exp_avg_sqs[i]]
        if amsgrad:
            new.append(v_max.to(max_exp_avg_sqs[i].dtype))
            old.append(max_exp_avg_sqs[i])
        for out, value in zip(outs, _unless_found_inf(found_inf, new, old)):
            out.append(value)
    return outs


@decomposition(aten._fused_adamw.default, aten._fused_adamw.tensor_lr)
def fused_adamw(*args, **kwargs):
    return _adam(*args, **kwargs, decoupled=True)


@decomposition(aten._fused_adam.default, aten._fused_adam.tensor_lr)
def fused_adam(*args, **kwargs):
    return _adam(*args, **kwargs, decoupled=False)


@decomposition(aten._fused_sgd.default, aten._fused_sgd.tensor_lr)
def fused_sgd(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening,
              nesterov, maximize, is_first_step, grad_scale=None, found_inf=None):
    outs = ([], [], [])
    for i, param in enumerate(params):
        grad = _opmath(_unscaled(grads[i], grad_scale))
        p = _opmath(param)
        g = -grad if maximize else grad
        if weight_decay != 0:
            g = g + p * weight_decay
        new = [None, grad.to(grads[i].dtype)]
        old = [param, grads[i]]
        if momentum != 0:
            buf = g if is_first_step else \
                _opmath(momentum_buffer_list[i]) * momentum + (g - g * dampening)
            g = g + buf * momentum if nesterov else buf
            new.append(buf.to(momentum_buffer_list[i].dtype))
            old.append(momentum_buffer_list[i])
        new[0] = (p - g * lr).to(param.dtype)
        for out, value in zip(outs, _unless_found_inf(found_inf, new, old)):
            out.append(value)
    return outs


def _adagrad(params, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps,
             maximize, grad_scale=None, found_inf=None):
    outs = ([], [], [])
    for i, param in enumerate(params):
        grad = _opmath(_unscaled(grads[i], grad_scale))
        p, total = _opmath(param), _opmath(state_sums[i])
        g = -grad if maximize else grad
        if weight_decay != 0:
            g = g + p * weight_decay
        clr = lr / (1 + (_step(state_steps[i], p) - 1) * lr_decay)
        total = total + g * g
        p = p - clr * g / (torch.sqrt(total) + eps)
        new = [p.to(param.dtype), grad.to(grads[i].dtype), total.to(state_sums[i].dtype)]
        old = [param, grads[i], state_sums[i]]
        for out, value in zip(outs, _unless_found_inf(found_inf, new, old)):
            out.append(value)
    return outs


@decomposition(aten._fused_adagrad.default)
def fused_adagrad(params, grads, state_sums, state_steps, **kwargs):
    # This overload also returns the steps (its in-place form marks them written); the kernel
    # only reads them: Adagrad counts the step outside it.
    return (*_adagrad(params, grads, state_sums, state_steps, **kwargs),
            [step.clone() for step in state_steps])


@decomposition(aten._fused_adagrad.tensor_lr)
def fused_adagrad_tensor_lr(*args, **kwargs):
    return _adagrad(*args, **kwargs)
