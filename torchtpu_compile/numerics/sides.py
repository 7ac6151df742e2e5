"""The two sides of a comparison: preparing a copy of the model for each, and running it.

Each side gets its own deep copy of the model (so gradients and buffer updates of one never
reach the other) and its own copy of the inputs. ``train=True`` runs the model in training
mode with dropout disabled (the two sides draw different random numbers), then back-propagates
fixed random cotangents through every differentiable output: a vector-Jacobian product, so no
loss function is needed.

Example::

    side = Side.build(model, (x,), device=torch.device("cpu"), train=True)
    result = side.run(cotangents=None)       # result.outputs, result.grads, result.buffers
"""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .. import config

#: torch's float32 precision switches per device type: the reference runs with each at "ieee".
_FP32_SWITCHES = {"cuda": ("cuda.matmul", "cudnn.conv", "cudnn.rnn"),
                  "cpu": ("mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn")}


def reference_device(reference: str) -> torch.device:
    """``"auto"``: CUDA where present, else CPU; ``"cuda"``/``"cuda:N"`` or ``"cpu"`` as given."""
    if reference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(reference)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"reference={reference!r}: expected 'auto', 'cuda' or 'cpu'")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"reference={reference!r} but this PyTorch has no CUDA device "
                         f"(torch.cuda.is_available() is False); use reference='cpu' or 'auto'")
    return device


def _switch(path: str):
    module = torch.backends
    for part in path.split("."):
        module = getattr(module, part, None)
    return module if hasattr(module, "fp32_precision") else None


@contextlib.contextmanager
def full_fp32(device: torch.device):
    """Run eager PyTorch on ``device`` in full float32, then restore the settings: on CUDA no
    TF32 (cuBLAS, cuDNN), on the CPU no oneDNN bf16.

    CUDA convolutions default to TF32 even under torch's default "highest" matmul precision.
    Only ``device``'s switches change. Inside, on CUDA, reading the legacy
    ``torch.backends.cudnn.allow_tf32`` raises: torch forbids mixing its old and new APIs.
    """
    saved = {path: _switch(path).fp32_precision
             for path in _FP32_SWITCHES.get(device.type, ()) if _switch(path)}
    # Importing torch.testing._internal freezes torch.backends flags; ours are set and restored.
    unfrozen = getattr(torch.backends, "__allow_nonbracketed_mutation")
    try:
        with unfrozen():
            for path in saved:
                _switch(path).fp32_precision = "ieee"
        yield
    finally:
        with unfrozen():
            for path, value in saved.items():
                _switch(path).fp32_precision = value


def torchtpu_precision(mode: str):
    """Set ``torchtpu_compile.config.matmul_precision`` to ``mode``, then restore it."""
    return config.patch(matmul_precision=mode)


def flatten(value, prefix: str = "output") -> dict:
    """Name every tensor in a nest of tuples, lists, dicts and ModelOutputs; skip the rest."""
    if isinstance(value, torch.Tensor):
        return {prefix: value}
    found: dict = {}
    if isinstance(value, Mapping):  # transformers' ModelOutput is an OrderedDict
        for key, item in value.items():
            found.update(flatten(item, f"{prefix}.{key}"))
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            found.update(flatten(item, f"{prefix}[{i}]"))
    return found


def _map_tensors(fn, value):
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_map_tensors(fn, v) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(fn, v) for k, v in value.items()}
    return value


def disable_dropout(module: torch.nn.Module) -> None:
    for sub in module.modules():
        if isinstance(sub, torch.nn.modules.dropout._DropoutNd):
            sub.p = 0.0


@dataclass
class Result:
    outputs: dict                                  # name -> tensor
    grads: dict = field(default_factory=dict)      # "grad.<param>" or "grad.input[i]" -> tensor
    buffers: dict = field(default_factory=dict)    # "buffer.<name>" -> tensor (train only)


@dataclass
class Side:
    """One copy of the model and inputs, on one device, ready to run."""
    fn: object
    inputs: tuple
    train: bool
    device: torch.device | None

    @classmethod
    def build(cls, model_or_fn, inputs: tuple, device: torch.device | None, train: bool):
        """Copy the model (to ``device`` unless None) and the inputs; set train or eval mode.

        For a plain function in training mode, every floating-point input gets a gradient;
        for a module, its parameters and the inputs that already require grad do.
        """
        fn = model_or_fn
        if isinstance(model_or_fn, torch.nn.Module):
            fn = copy.deepcopy(model_or_fn)
            if device is not None:
                fn = fn.to(device)
            fn.train(train)
            if train:
                disable_dropout(fn)
        is_module = isinstance(fn, torch.nn.Module)

        def copy_input(t: torch.Tensor) -> torch.Tensor:
            wants_grad = train and t.is_floating_point() and (t.requires_grad or not is_module)
            t = t.detach().clone()
            if device is not None:
                t = t.to(device)
            return t.requires_grad_(wants_grad)

        return cls(fn, _map_tensors(copy_input, tuple(inputs)), train, device)

    def run(self, call=None, cotangents: dict | None = None) -> tuple[Result, dict]:
        """Run forward (through ``call``, default the model itself) and, in training mode, the
        backward of ``cotangents`` (made here from a fixed seed when None).

        Returns the result and the cotangents used, keyed by output name.
        """
        call = self.fn if call is None else call
        if not self.train:
            with torch.no_grad():
                return Result(flatten(call(*self.inputs))), {}
        outputs = flatten(call(*self.inputs))
        differentiable = {k: v for k, v in outputs.items() if v.requires_grad}
        if not differentiable:
            raise ValueError("train=True, but no output of the model requires grad")
        if cotangents is None:
            cotangents = make_cotangents(differentiable)
        names = [k for k in differentiable if k in cotangents]
        torch.autograd.backward([differentiable[k] for k in names],
                                [cotangents[k].to(differentiable[k].device) for k in names])
        return Result({k: v.detach() for k, v in outputs.items()}, self.grads(),
                      self.buffers()), cotangents

    def grads(self) -> dict:
        grads = {}
        if isinstance(self.fn, torch.nn.Module):
            for name, param in self.fn.named_parameters():
                if param.grad is not None:
                    grads[f"grad.{name}"] = param.grad
        for name, tensor in flatten(self.inputs, "input").items():
            if tensor.grad is not None:
                grads[f"grad.{name}"] = tensor.grad
        return grads

    def buffers(self) -> dict:
        if not isinstance(self.fn, torch.nn.Module):
            return {}
        return {f"buffer.{name}": b.detach() for name, b in self.fn.named_buffers()}


def make_cotangents(outputs: dict) -> dict:
    """Seeded standard-normal cotangents, on the CPU, one per output (the same on both sides)."""
    generator = torch.Generator().manual_seed(0)
    return {name: torch.randn(tuple(t.shape), generator=generator).to(t.dtype)
            for name, t in outputs.items()}
