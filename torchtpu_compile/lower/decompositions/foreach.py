"""``_foreach_*`` ops as one call of the plain op per list element.

Optimizers call foreach ops on accelerator tensors (``tpu`` is one of the foreach devices), and
functionalization turns them into functional ``_foreach_*`` overloads that torch-mlir does not
lower. Written per element, they lower, and XLA fuses the whole list into one program anyway.

Example::

    table = decomposition_table()          # includes these
    table[torch.ops.aten._foreach_add.List]([a, b], [c, d], alpha=2.0)   # [a + 2c, b + 2d]
"""
from __future__ import annotations

import torch

from .registry import decomposition

aten = torch.ops.aten


def _addc(fn):
    def per_element(x, t1, t2, value=1):
        return fn(x, t1, t2, value=value)
    return per_element


def _norm(x, ord=2, dtype=None):
    return torch.linalg.vector_norm(x, ord, dtype=dtype)


def _copy(x, src, non_blocking=False):
    return aten.copy.default(x, src)


def _against_a_number(tensor_op, number_op):
    # torch.maximum/minimum take tensors only; eager's foreach kernels clamp for a number
    # (ASGD's capturable step: _foreach_maximum_(etas, 1)).
    def per_element(x, other):
        return tensor_op(x, other) if isinstance(other, torch.Tensor) else number_op(x, other)
    return per_element


# Plain ops whose foreach arguments do not map one to one onto the plain signature.
_SPECIAL = {
    "maximum": _against_a_number(torch.maximum, torch.clamp_min),
    "minimum": _against_a_number(torch.minimum, torch.clamp_max),
    "addcdiv": _addc(torch.addcdiv),
    "addcmul": _addc(torch.addcmul),
    "norm": _norm,
    "zero": torch.zeros_like,
    "copy": _copy,
}


def _per_element(base: str):
    plain = _SPECIAL.get(base) or getattr(torch, base)

    def decompose(*args, **kwargs):
        length = next(len(a) for a in args if isinstance(a, (list, tuple)))
        return [plain(*(a[i] if isinstance(a, (list, tuple)) else a for a in args), **kwargs)
                for i in range(length)]
    decompose.__name__ = f"_foreach_{base}"
    return decompose


def _functional_foreach_overloads():
    # dir(aten) lists only the ops loaded so far; the dispatcher knows them all.
    for qualified in sorted(torch._C._dispatch_get_all_op_names()):
        name, _, overload = qualified.partition(".")
        if not name.startswith("aten::_foreach_") or name.endswith("_"):
            continue
        base = name[len("aten::_foreach_"):]
        if base not in _SPECIAL and not hasattr(torch, base):
            continue
        if overload.endswith("out"):
            continue  # out= variants: never reach the lowering (support.py sends them to eager)
        if overload == "Tensor" and base in ("addcdiv", "addcmul"):
            continue  # the scalars come packed in one tensor: rare, left to the lowering
        packet = getattr(aten, name[len("aten::"):])
        yield base, getattr(packet, overload or "default")


for _base, _op in _functional_foreach_overloads():
    decomposition(_op)(_per_element(_base))
