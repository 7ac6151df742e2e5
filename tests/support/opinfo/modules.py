"""One ModuleInfo entry (PyTorch's ``module_db``) on one path, compared with eager CPU:
``check_module(info, path)``.

For each of an entry's samples (in training mode, and in eval mode too where the entry says the two
differ), the module is built on the CPU from a fixed seed and deep-copied; one copy runs in eager
CPU PyTorch, the other on the path (``compile``: the module called through
``torch.compile(backend="torchtpu")`` on CPU tensors; ``eager`` and ``fuse``: the module and its
inputs moved to the ``tpu`` device, run in strict or defer-and-fuse mode). Compared, with the
OpInfo harness's tolerances and its rescue by a wider (fp64) reference: the forward outputs; the
gradients of the parameters and of the inputs from a random cotangent of the outputs; and the
module's parameters and buffers after the call (batch norm's running statistics, Embedding's
``max_norm`` renormalization). Statuses and the ``Result`` are the OpInfo harness's
(``harness.Result``); the entry's name is ``module_db``'s (``"nn.LSTM"``), and its skips are
``skips.MODULE_SKIPS``.
"""
from __future__ import annotations

import copy
import time

import torch
from torch.utils._pytree import tree_flatten, tree_map

from . import paths, skips
from .harness import Result, _compare, _one_line, conclude, count_sample, skipped


#: Samples per entry and training mode in the sweep (PyTorch's lists run to 40 for RNNs; the
#: first few span each module's constructor options without a ten-minute sweep).
MAX_SAMPLES = 3

#: (entry, path) -> why it fails today: the slow test xfails these (and fails when one starts
#: passing, so that the list shrinks with the fixes).
KNOWN_FAILURES: dict = {}


def module_entries() -> dict:
    """{name: ModuleInfo} over ``module_db``, in its order."""
    from torch.testing._internal.common_modules import module_db
    return {info.name: info for info in module_db}


def training_modes(info) -> tuple:
    """As PyTorch's ``@modules`` runs them: training, and eval only where the two differ."""
    return (True, False) if info.train_and_eval_differ else (True,)


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    return value


def _forward_call(sample):
    """(args, kwargs) of a sample's forward input, tensors cloned as fresh leaves."""
    forward = sample.forward_input
    return tree_map(_clone, (tuple(forward.args), dict(forward.kwargs)))


def _build(info, sample, training: bool):
    torch.manual_seed(0)
    constructor = sample.constructor_input
    module = info.module_cls(*constructor.args, **constructor.kwargs)
    return module.train(training)


def _tensors(tree) -> list:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _backward(module, seed: int):
    """The ``then`` of a path: (outputs, gradients of the parameters by name, gradients of the
    inputs in order) for a random cotangent drawn on the CPU from ``seed``."""
    def then(value, args, kwargs):
        outputs = [t for t in _tensors(value) if t.requires_grad]
        params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        inputs = [t for t in _tensors((args, kwargs)) if t.requires_grad]
        wrt = [p for _, p in params] + inputs
        if not outputs or not wrt:
            return value, {}, []
        generator = torch.Generator().manual_seed(seed)
        cotangents = [torch.randn(o.shape, generator=generator, dtype=o.dtype).to(o.device)
                      for o in outputs]
        grads = torch.autograd.grad(outputs, wrt, cotangents, allow_unused=True)
        return value, {n: g for (n, _), g in zip(params, grads)}, list(grads[len(params):])
    return then


def _state(module) -> dict:
    return {name: value.detach().cpu() for name, value in module.state_dict().items()}


def _widen(value):
    if isinstance(value, torch.Tensor) and value.dtype is torch.float32:
        return value.detach().double().requires_grad_(value.requires_grad)
    return value


def _cpu_run(module, args, kwargs, seed: int, index: int):
    torch.manual_seed(index)
    result = _backward(module, seed)(module(*args, **kwargs), args, kwargs)
    return result, _state(module)


def _compare_sample(actual, actual_state, expected, expected_state, wide):
    """Outputs, gradients and state after the call; ``wide()`` gives the fp64 reference when
    fp32 does not match (XLA reassociates; a result nearer the fp64 answer than eager's passes)."""
    parts = (("output", 0), ("parameter gradient", 1), ("input gradient", 2))
    for what, i in parts:
        try:
            _compare(actual[i], expected[i], torch.float32, what=what)
        except AssertionError:
            reference, _ = wide()
            _compare(actual[i], expected[i], torch.float32, reference[i], what=what)
    try:
        _compare(actual_state, expected_state, torch.float32, what="state after the call")
    except AssertionError:
        _compare(actual_state, expected_state, torch.float32, wide()[1],
                 what="state after the call")


def check_module(info, path: str, max_samples: int = MAX_SAMPLES) -> Result:
    """Run the first ``max_samples`` samples (0: all) of ModuleInfo ``info`` (per training mode) on
    ``path`` and compare with eager CPU.

    Example::

        check_module(module_entries()["nn.Linear"], "compile").status   # "pass"
    """
    name = info.name
    result = Result(name, path, "fp32", "pass")
    if skipped(result, table=skips.MODULE_SKIPS):
        return result
    start = time.perf_counter()
    notes = []
    try:
        for training in training_modes(info):
            samples = info.module_inputs_func(info, device="cpu", dtype=torch.float32,
                                              requires_grad=True, training=training)
            for index, sample in enumerate(samples[:max_samples or None]):
                mode = "train" if training else "eval"
                where = f"[{mode} sample {index}{': ' + sample.desc if sample.desc else ''}] "
                try:
                    _check_sample(info, path, sample, training, index, result, notes)
                except Exception as exc:
                    raise type(exc)(where + str(exc)) if isinstance(exc, AssertionError) \
                        else RuntimeError(where + _one_line(exc)) from exc
    except Exception as exc:  # every failure becomes a row of the table, named
        result.status, result.detail = "fail", _one_line(exc)
        result.seconds = time.perf_counter() - start
        return result
    return conclude(result, start, notes, "ModuleInfo yields no samples")


def _check_raises(path, tested, sample, seed, index, expected: Exception) -> None:
    """The path raises what eager raised: the same exception type (the message may name the
    path's own op)."""
    args, kwargs = _forward_call(sample)
    torch.manual_seed(index)
    if path in paths.ON_DEVICE:
        tested.to("tpu")
    try:
        paths.PATHS[path](tested, args, kwargs, then=_backward(tested, seed))
    except type(expected):
        return
    except Exception as exc:
        raise AssertionError(f"raised {type(exc).__name__}: {_one_line(exc)}; eager raised "
                             f"{_one_line(expected)}") from exc
    raise AssertionError(f"returned a value where eager raised {_one_line(expected)}")


def _check_sample(info, path, sample, training, index, result, notes) -> None:
    pristine = _build(info, sample, training)
    reference, tested = copy.deepcopy(pristine), copy.deepcopy(pristine)
    seed = 1000 + index
    try:
        expected, expected_state = _cpu_run(reference, *_forward_call(sample), seed, index)
    except Exception as exc:  # a sample eager rejects (an fp64 argument to an fp32 module):
        _check_raises(path, tested, sample, seed, index, exc)  # the path must reject it too
        result.samples += 1
        return

    def wide():
        module = copy.deepcopy(pristine).double()
        args, kwargs = tree_map(_widen, _forward_call(sample))
        return _cpu_run(module, args, kwargs, seed, index)

    args, kwargs = _forward_call(sample)
    torch.manual_seed(index)
    if path in paths.ON_DEVICE:
        tested.to("tpu")
    outcome = paths.PATHS[path](tested, args, kwargs, then=_backward(tested, seed))
    actual_state = _state(tested)
    _compare_sample(outcome.value, actual_state, expected, expected_state, wide)
    count_sample(result, outcome, notes)
