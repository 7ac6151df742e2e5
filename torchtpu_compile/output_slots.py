"""Where each output of a prepared graph comes from, and the one loop that rebuilds them.

``lower/calling_convention.py`` drops from a program the outputs XLA need not compute (None,
inputs returned as they are, constants, duplicates, tensors with no elements) and records an
``OutputSlot`` for each;
compiled programs (``program.py``) and loaded AOT artifacts (``aot/loader.py``) put them back
with ``collect_outputs``. This module imports nothing heavy: the AOT loader must not pull in
torch-mlir.

Example::

    slots = [OutputSlot("program", 0), OutputSlot("input", 1), OutputSlot("none")]
    collect_outputs(slots, [y], [x, w]) == [y, w, None]
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class OutputSlot:
    """Where one output of the original graph comes from."""
    kind: str          # "program" (index into program outputs), "input", "none", "constant",
    #                    "empty" (value: [shape, dtype name, device type]), "check" (the
    #                    program output of index checks, value: their specs; no graph output)
    index: int = -1
    value: object = None

    def to_json(self) -> dict:
        """A JSON-ready form (AOT manifests); constants are ints, floats or bools."""
        return {"kind": self.kind, "index": self.index, "value": self.value}

    @classmethod
    def from_json(cls, data: dict) -> "OutputSlot":
        return cls(data["kind"], data.get("index", -1), data.get("value"))


def collect_outputs(slots: list, results: list, args: list, device: str | None = None,
                    defer_checks: bool = False) -> list:
    """The original graph's outputs from the program's ``results`` and the call's ``args``.

    The one reading of ``OutputSlot``s: compiled programs and loaded AOT artifacts both use it,
    so an output that is an input, a constant or None comes back the same way on each path.
    Tensors with no elements are made here, on ``device`` (default: the traced one). The
    "check" slot's result (a PJRT buffer, not wrapped) is read now, raising for an index out
    of range, or, with ``defer_checks`` (results that stay on the device), at the next
    synchronization point (``index_errors.py``).

    Example::

        slots = [OutputSlot("program", 0), OutputSlot("input", 1), OutputSlot("none")]
        collect_outputs(slots, [y], [x, w]) == [y, w, None]
    """
    outputs = []
    for slot in slots:
        kind = slot.kind
        if kind == "program":
            outputs.append(results[slot.index])
        elif kind == "input":
            outputs.append(args[slot.index])
        elif kind == "constant":
            outputs.append(slot.value)
        elif kind == "empty":
            outputs.append(empty_tensor(slot.value, device))
        elif kind == "check":
            from . import index_errors
            if defer_checks:
                index_errors.defer(results[slot.index], slot.value)
            else:
                index_errors.check_now(results[slot.index], slot.value)
        else:
            outputs.append(None)
    return outputs


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
