"""Outputs that view a graph input, made by the backend from the caller's tensor under
dynamic shapes, not rebuilt by aot_autograd.

aot_autograd rebuilds an output that views a graph input from the input itself, after the
compiled function ran. With dynamic shapes it places the view by the storage offset (and base)
of its own traced input, which starts at 0 even where the real input does not: for
``x = torch.arange(5)[1:]``, ``x.add_(1); return x.expand(2, *x.shape)`` returned rows
``[0, 2, 3, 4]`` where eager returns ``[2, 3, 4, 5]``, and with a second written input it
raised "setStorage ... out of bounds" (fuzz seed 3208; Inductor and aot_eager the same).
Dynamo's example values hold each such output's sizes, strides and offset relative to its
input (numbers, or expressions in the graph's size symbols), so the backend takes these
outputs out of the graph and makes each, after the compiled function ran, as an
``as_strided`` view of the caller's input at ``input offset + relative offset``.

Example::

    gm, views = InputViews.split(gm)         # views is None for most graphs
    run = views.around(compiled) if views else compiled
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from ._logging import log


def _expr(value):
    return value.node.expr if isinstance(value, torch.SymInt) else value


def _symbol_readers(placeholders: list) -> dict:
    """Size symbol -> how to read its value from the call's arguments."""
    import sympy
    readers: dict = {}
    for k, node in enumerate(placeholders):
        value = node.meta.get("example_value")
        if isinstance(value, torch.SymInt) and isinstance(_expr(value), sympy.Symbol):
            readers.setdefault(_expr(value), lambda args, k=k: int(args[k]))
        elif isinstance(value, torch.Tensor):
            for d, size in enumerate(value.shape):
                if isinstance(_expr(size), sympy.Symbol):
                    readers.setdefault(_expr(size), lambda args, k=k, d=d: args[k].shape[d])
    return readers


@dataclasses.dataclass
class _View:
    output: int          # position among the graph's outputs
    input: int           # position among its arguments
    geometry: tuple      # (sizes, strides, offset relative to the input): ints or expressions
    detach: bool         # the output does not require grad where its input does

    def make(self, args, readers: dict) -> torch.Tensor:
        base = args[self.input]
        sizes, strides, offset = (_evaluate(g, args, readers) for g in self.geometry)
        if self.detach:
            base = base.detach()
        return base.as_strided(sizes, strides, base.storage_offset() + offset)


def _evaluate(value, args, readers: dict):
    if isinstance(value, tuple):
        return tuple(_evaluate(v, args, readers) for v in value)
    if isinstance(value, int):
        return value
    return int(value.xreplace({s: readers[s](args) for s in value.free_symbols}))


def _constant(expr):
    return int(expr) if getattr(expr, "is_Integer", False) else expr


@dataclasses.dataclass
class InputViews:
    """The outputs of one graph made as views of its inputs after the compiled call."""

    views: list
    readers: dict
    outputs: int         # the graph's output count before the split

    @classmethod
    def split(cls, gm: fx.GraphModule) -> tuple[fx.GraphModule, InputViews | None]:
        """``gm`` without its outputs that view an input (other than the input itself), and
        how to make them; ``(gm, None)`` for a graph with static shapes (aot_autograd traces
        their offsets) or no such output."""
        import sympy
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        values = [n.meta.get("example_value") for n in placeholders]
        if not any(isinstance(v, torch.SymInt) for v in values):
            return gm, None
        output = next(n for n in gm.graph.nodes if n.op == "output")
        if not isinstance(output.args[0], (list, tuple)):
            return gm, None
        inputs = {}
        for k, v in enumerate(values):
            if isinstance(v, torch.Tensor):
                inputs.setdefault(v.untyped_storage()._cdata, k)
        readers = _symbol_readers(placeholders)
        views = []
        for i, node in enumerate(output.args[0]):
            out = node.meta.get("example_value") if isinstance(node, fx.Node) else None
            if not isinstance(out, torch.Tensor) or any(out is v for v in values):
                continue
            k = inputs.get(out.untyped_storage()._cdata)
            if k is None:
                continue
            relative = sympy.simplify(sympy.sympify(_expr(out.storage_offset()))
                                      - sympy.sympify(_expr(values[k].storage_offset())))
            geometry = (tuple(_constant(sympy.sympify(_expr(s))) for s in out.shape),
                        tuple(_constant(sympy.sympify(_expr(s))) for s in out.stride()),
                        _constant(relative))
            symbols = set().union(*(getattr(g, "free_symbols", set())
                                    for part in geometry[:2] for g in part),
                                  getattr(geometry[2], "free_symbols", set()))
            if not symbols <= set(readers):
                log.debug("torchtpu: output %d views input %d with a geometry we cannot "
                          "evaluate (%s); left to aot_autograd", i, k, geometry)
                continue
            views.append(_View(i, k, geometry,
                               values[k].requires_grad and not out.requires_grad))
        if not views:
            return gm, None
        taken = {v.output for v in views}
        kept = tuple(a for i, a in enumerate(output.args[0]) if i not in taken)
        output.args = (kept,)  # the views' nodes stay: Dynamo graphs hold unused writes
        gm.recompile()
        return gm, cls(views, readers, len(taken) + len(kept))

    def around(self, compiled):
        """``compiled`` (of the split graph) returning every output of the whole graph."""
        def run(*args):
            kept = iter(compiled(*args))
            made = {v.output: v.make(args, self.readers) for v in self.views}
            return [made[i] if i in made else next(kept) for i in range(self.outputs)]
        return run
