"""Where each output of a prepared graph comes from, and the one loop that rebuilds them.

``lower/calling_convention.py`` drops from a program the outputs XLA need not compute (None,
inputs returned as they are, constants, duplicates, tensors with no elements, views of inputs
or of other outputs) and records an ``OutputSlot`` for each; the one run path
(``program/run.py``: compiled graphs, the eager device's programs, loaded AOT artifacts) puts
them back with ``collect_outputs``. This module imports nothing heavy: the AOT loader must not
pull in torch-mlir.

Example::

    slots = [OutputSlot("program", 0), OutputSlot("input", 1), OutputSlot("none")]
    collect_outputs(slots, [y], [x, w]) == [y, w, None]
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from . import index_errors


@dataclass
class OutputSlot:
    """Where one output of the original graph comes from."""
    kind: str          # "program" (index into program outputs; value: None, or
    #                    {"memory_order": dims}, the program computing it permuted so:
    #                    calling_convention._eager_layout), "input", "none", "constant",
    #                    "empty" (value: [shape, dtype name, device type]), "view" (value:
    #                    {"of": "program" | "input", "ops": view steps}; index: the base's),
    #                    "check" (the program output of index checks, value: their specs; no
    #                    graph output)
    index: int = -1
    value: object = None
    _steps: object = field(default=None, init=False, repr=False, compare=False)
    _inverse: object = field(default=None, init=False, repr=False, compare=False)

    def to_json(self) -> dict:
        """A JSON-ready form (AOT manifests); constants are ints, floats or bools."""
        return {"kind": self.kind, "index": self.index, "value": self.value}

    @classmethod
    def from_json(cls, data: dict) -> OutputSlot:
        return cls(data["kind"], data.get("index", -1), data.get("value"))


def collect_outputs(slots: list, results: list, args: list, device: str | None = None,
                    defer_checks: bool = False, locations=None, empty=None) -> list:
    """The original graph's outputs from the program's ``results`` and the call's ``args``.

    The one reading of ``OutputSlot``s, for every program (compiled graphs, the eager device's,
    loaded AOT artifacts), so an output that is an input, a constant or None comes back the same
    way on each path. It reads tensors (``results`` and ``args`` are tensors) or PJRT buffers
    (the eager device: ``empty(spec)`` then makes the buffer of a tensor with no elements).
    Tensors with no elements are made by ``empty``, by default here on ``device`` (default: the
    traced one). The "check" slot's result (a PJRT buffer, not wrapped) is read now, raising
    for an index out of range, or, with ``defer_checks`` (results that stay on the device), at
    the next synchronization point (``index_errors.py``); ``locations`` says where the op was
    called when the checks do not know it (eager ops).

    Example::

        slots = [OutputSlot("program", 0), OutputSlot("input", 1), OutputSlot("none")]
        collect_outputs(slots, [y], [x, w]) == [y, w, None]
    """
    outputs = []
    for slot in slots:
        kind = slot.kind
        if kind == "program":
            outputs.append(results[slot.index] if slot.value is None else
                           _in_eager_layout(results[slot.index], slot))
        elif kind == "input":
            outputs.append(args[slot.index])
        elif kind == "constant":
            outputs.append(slot.value)
        elif kind == "empty":
            outputs.append(empty_tensor(slot.value, device) if empty is None else
                           empty(slot.value))
        elif kind == "view":
            if slot.value["of"] == "program":
                base = results[slot.index]
                if "memory_order" in slot.value:  # computed in eager's memory order
                    base = _in_eager_layout(base, slot)
            else:
                base = args[slot.index]
            outputs.append(_rebuilt_view(slot, base))
        elif kind == "check":
            if defer_checks:
                index_errors.defer(results[slot.index], slot.value, locations)
            else:
                index_errors.check_now(results[slot.index], slot.value, locations)
        elif kind == "none":
            outputs.append(None)
        else:  # an artifact from a newer torchtpu, say: never a silent None
            raise ValueError(f"output slot of unknown kind {kind!r}")
    return outputs


def results_are_outputs(slots: list) -> bool:
    """Whether the outputs are the program's results as they come (every slot "program", in
    order, none restrided): the run path then skips ``collect_outputs`` (the common eager op)."""
    return all(slot.kind == "program" and slot.index == i and slot.value is None
               for i, slot in enumerate(slots))


def check_index(slots: list):
    """The program output index of the "check" slot (left as a PJRT buffer), or None."""
    return next((slot.index for slot in slots if slot.kind == "check"), None)


def empty_spec(value) -> list:
    """The "empty" slot's value for a tensor with no elements: [shape, dtype name, device]."""
    return [list(value.shape), str(value.dtype).removeprefix("torch."), value.device.type]


def empty_tensor(spec: list, device: str | None = None):
    """The tensor with no elements that ``spec`` (from ``empty_spec``) describes.

    Example::

        empty_tensor([[0], "uint8", "cpu"])      # tensor([], dtype=torch.uint8)
    """
    import torch  # not at import: the loader's light imports (torch is loaded by then anyway)
    shape, dtype, traced_device = spec
    return torch.empty(shape, dtype=getattr(torch, dtype), device=device or traced_device)


# --- views rebuilt after the program runs ----------------------------------------------------
# A graph output that is a view of another output (or of an input) is a view in eager PyTorch:
# a write through one shows in the other. XLA returns fresh buffers, so such an output is not
# computed by the program but replayed on its base, op by op. The steps are JSON (AOT
# manifests): [op name, args, kwargs, item of a multi-output view or None].

def encode_view_steps(steps: list):
    """``steps`` as [(OpOverload, args, kwargs, item)] in JSON form; None where an argument
    has no JSON form (then the output is computed by the program, not rebuilt).

    Example::

        encode_view_steps([(torch.ops.aten.view.default, ([-1],), {}, None)])
        # [["aten.view.default", [[-1]], {}, None]]
    """
    encoded = []
    for op, args, kwargs, item in steps:
        try:
            encoded.append([str(op), _encode(list(args)), _encode(dict(kwargs)), item])
        except TypeError:
            return None
    return encoded


def decode_view_steps(encoded: list) -> list:
    """The callable steps of ``encode_view_steps``'s JSON: [(op, args, kwargs, item)]."""
    return [(_op(name), _decode(args), _decode(kwargs), item)
            for name, args, kwargs, item in encoded]


def replay_view_steps(base, steps: list):
    """``base`` seen through ``steps`` (from ``decode_view_steps``): a view sharing its storage.

    Example::

        y = replay_view_steps(x, decode_view_steps([["aten.view.default", [[-1]], {}, None]]))
        y._base is x
    """
    for op, args, kwargs, item in steps:
        base = op(base, *args, **kwargs)
        if item is not None:
            base = base[item]
    return base


_DTYPE_TAG = "torch.dtype"  # {"torch.dtype": "float32"}: no ATen argument is named so


def memory_order(value) -> list | None:
    """The dims of tensor ``value`` from outermost to innermost in memory, where its layout is
    dense and not contiguous (``x.t() * 2``, a channels-last conv's output, the CPU's flash
    attention result); None otherwise (contiguous, overlapping, with gaps, symbolic, fewer
    than two elements or dims).

    Example::

        memory_order(torch.empty(2, 3).t())      # [1, 0]
    """
    import torch
    from torch._prims_common import is_non_overlapping_and_dense_or_false
    if not isinstance(value, torch.Tensor) or value.dim() < 2 or value.is_sparse:
        return None
    strides = value.stride()
    if not all(isinstance(v, int) for v in (*value.shape, *strides)) or value.numel() < 2 \
            or value.is_contiguous() or not is_non_overlapping_and_dense_or_false(value):
        return None
    return sorted(range(value.dim()), key=lambda d: (-strides[d], d))


def _in_eager_layout(result, slot: OutputSlot):
    """The output whose elements ``result`` holds in eager's memory order (the slot's
    ``memory_order``: its dims from outermost to innermost), with eager's strides: a tensor of
    its own on ``result``'s memory, not a view (aot_autograd's outputs may be written in
    place)."""
    if slot._inverse is None:
        order = slot.value["memory_order"]
        slot._inverse = sorted(range(len(order)), key=order.__getitem__)
    laid_out = result.permute(slot._inverse)
    return result.new_empty(0).set_(laid_out)


def _rebuilt_view(slot: OutputSlot, base):
    if slot._steps is None:
        slot._steps = decode_view_steps(slot.value["ops"])
    try:
        return replay_view_steps(base, slot._steps)
    except RuntimeError as exc:
        # prepare() checked the steps on the layouts a base can come with (as traced,
        # contiguous); an eager fallback's result can have others. Its values, unaliased.
        from ._logging import warn_once
        warn_once(("view-replay", str(slot.value["ops"])),
                  "torchtpu: an output that views %s %d cannot be rebuilt as a view of its "
                  "base (%s); it is returned as a copy, and writes to it will not reach the "
                  "base", slot.value["of"], slot.index, exc)
        return replay_view_steps(base.contiguous(), slot._steps)


def _encode(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if type(value).__name__ == "dtype" and type(value).__module__ == "torch":
        return {_DTYPE_TAG: str(value).removeprefix("torch.")}
    raise TypeError(f"no JSON form for a view argument of type {type(value).__name__}")


def _decode(value):
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {_DTYPE_TAG}:
            import torch
            return getattr(torch, value[_DTYPE_TAG])
        return {k: _decode(v) for k, v in value.items()}
    return value


@functools.cache
def _op(name: str):
    # Only view ops: the steps may come from an artifact's manifest, and replaying anything
    # else there (a write, a copy) would let a file run ops on the caller's tensors.
    import torch
    namespace, op, overload = name.split(".")
    found = getattr(getattr(getattr(torch.ops, namespace), op), overload)
    if not isinstance(found, torch._ops.OpOverload) or not found.is_view:
        raise ValueError(f"{name} is not a view op")
    return found
