"""Guards Dynamo leaves out: C method descriptors a frame holds (``torch.Tensor.relu``).

Dynamo calls such a value without guarding it ("Don't need to guard on wrappers", torch
2.13), so a frame traced with ``op = torch.Tensor.relu`` and called again with
``torch.Tensor.sigmoid`` (a closure over it, or a module attribute holding it) ran relu's
graph, on every backend. For our backend's frames the backend adds an ``ID_MATCH`` guard per
descriptor the frame's locals, closure variables and their modules hold, so another one
traces again; the Dynamo-level cache fingerprints these guards as any other (a second
process's sigmoid loaded the first's relu graph before).

Example::

    descriptor_paths({"op": torch.Tensor.relu})   # [(("op",), <method 'relu' ...>)]
"""
from __future__ import annotations

import torch


def descriptor_paths(local_scope: dict) -> list:
    """(where, descriptor) for each C method or slot descriptor held by a frame local, a
    closure variable or an attribute of a module among them; ``where`` is ``(name,)`` or
    ``(name, submodule path, attribute)``."""
    from torch._dynamo.utils import is_wrapper_or_member_descriptor
    found = []
    for name, value in local_scope.items():
        if is_wrapper_or_member_descriptor(value):
            found.append(((name,), value))
        elif isinstance(value, torch.nn.Module):
            for path, module in value.named_modules(remove_duplicate=False):
                for attr, held in vars(module).items():
                    if is_wrapper_or_member_descriptor(held):
                        found.append(((name, path, attr), held))
    return found


def guard_descriptors() -> None:
    """In a backend call: an ``ID_MATCH`` guard on each descriptor the frame being traced
    holds (module doc). Nothing where Dynamo is not tracing a frame."""
    from torch._dynamo.guards import GuardBuilder, install_guard
    from torch._dynamo.source import AttrSource, LocalSource
    from torch._dynamo.symbolic_convert import InstructionTranslator
    try:
        tx = InstructionTranslator.current_tx()
    except AttributeError:  # never set on this thread: the backend called outside Dynamo
        return
    if tx is None:
        return
    for where, _ in descriptor_paths(tx.f_locals):
        source = LocalSource(where[0])
        if len(where) == 3:
            for part in [p for p in where[1].split(".") if p] + [where[2]]:
                source = AttrSource(source, part)
        install_guard(source.make_guard(GuardBuilder.ID_MATCH))
