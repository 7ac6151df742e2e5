"""Where each output of a prepared graph comes from, and the one loop that rebuilds them.

``lower/calling_convention.py`` drops from a program the outputs XLA need not compute (None,
inputs returned as they are, constants, duplicates) and records an ``OutputSlot`` for each;
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
    kind: str          # "program" (index into program outputs), "input", "none", "constant"
    index: int = -1
    value: object = None

    def to_json(self) -> dict:
        """A JSON-ready form (AOT manifests); constants are ints, floats or bools."""
        return {"kind": self.kind, "index": self.index, "value": self.value}

    @classmethod
    def from_json(cls, data: dict) -> "OutputSlot":
        return cls(data["kind"], data.get("index", -1), data.get("value"))


def collect_outputs(slots: list, results: list, args: list) -> list:
    """The original graph's outputs from the program's ``results`` and the call's ``args``.

    The one reading of ``OutputSlot``s: compiled programs and loaded AOT artifacts both use it,
    so an output that is an input, a constant or None comes back the same way on each path.

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
        else:
            outputs.append(None)
    return outputs
