"""Where to cut a graph whose inputs die while it runs, so that they die between its pieces.

An XLA program holds every input until it returns, and allocates its results and temporaries
while they are all still live. Inductor's code frees each input after its last use. That
matters for a backward graph: aot_autograd hands it the activations saved by the forward and
lets go of them before the call (the boxed list, ``GraphRunner``), so they die as soon as the
graph is done with them. A language model's loss is the case that counts: the saved
log-probabilities (tokens x vocabulary) are read once, at the start, to make the logits'
gradient, the same size; the LM head's two matmuls then read that gradient; the transformer's
backward comes after. As one program, all three stages hold the saved log-probabilities and
the logits' gradient to the end, with every gradient the rest produces. Cut after each of
those last uses, the pieces free them between calls: the GPT-2 AdamW step of
``bench/memory.py`` then never holds both.

``plan_pieces`` estimates a run's peak as the most bytes live during any piece: the values
live when it starts (held until it returns), the values it hands on, and its largest
temporary. It adds the cut that lowers that estimate most, among cuts right after the last
use of a large value, while each cut saves enough (``MIN_SAVING_BYTES`` and
``MIN_SAVING_SHARE``) and pieces stay few (``MAX_PIECES``): each piece is a launch of its own,
and fusions do not cross a cut. ``config.split_backward`` says where it applies (by default
not on the CPU client, where it costs time and the host's peak does not move:
docs/performance.md, "Training memory").

Example::

    pieces = plan_pieces(backward_gm)      # None, or a piece index per compute node
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

#: A cut must lower the estimated peak by at least this many bytes ...
MIN_SAVING_BYTES = 16 << 20
#: ... and by at least this share of it.
MIN_SAVING_SHARE = 0.05
#: At most this many pieces per graph.
MAX_PIECES = 4


def _nbytes(value) -> int | None:
    """Bytes of a node's value (a tensor, or a tuple of them); None where a size is
    symbolic."""
    if isinstance(value, torch.Tensor):
        if any(not isinstance(s, int) for s in value.shape):
            return None
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        total = 0
        for each in value:
            size = _nbytes(each)
            if size is None:
                return None
            total += size
        return total
    return 0


class _Liveness:
    """Each buffer's bytes, where it is made and where it is last read, in node order.

    A view owns no bytes: it keeps its base alive as long as it is read. A value a fusion
    can compute on the fly (an elementwise op, a fill) is a buffer only where something
    reads it whole (``_reads_whole``) or it is handed on; a matmul's or a reduction's result
    is always one.
    """

    def __init__(self, gm: fx.GraphModule):
        self.compute = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
        self.end = len(self.compute)  # read by the output: live to the end
        index = {node: i for i, node in enumerate(self.compute)}
        base, size, made, last, whole = {}, {}, {}, {}, {}
        self.ok = True
        for node in gm.graph.nodes:
            if node.op == "output":
                continue
            made[node] = -1 if node.op == "placeholder" else index[node]
            last[node] = max((self.end if user.op == "output" else index[user]
                              for user in node.users), default=made[node])
            if _is_view(node):
                base[node] = base.get(node.args[0], node.args[0])
                continue
            nbytes = _nbytes(node.meta.get("val"))
            if nbytes is None:
                self.ok = False
                return
            size[node] = nbytes
            whole[node] = node.op == "placeholder" or not _fusible(node) or any(
                _reads_whole(user) for user in node.users)
        for view, root in base.items():
            if root in last:
                last[root] = max(last[root], last[view])
                whole[root] = whole[root] or any(_reads_whole(user) for user in view.users)
        # (bytes, made at, last read at, a buffer even where it dies inside its piece)
        self.values = [(size[n], made[n], last[n], whole[n]) for n in size]

    def peak(self, cuts: list) -> int:
        """The estimated peak with the graph cut before each node index in ``cuts``."""
        bounds = [0] + sorted(cuts) + [self.end]
        worst = 0
        for start, stop in zip(bounds, bounds[1:]):
            held = handed = temporary = 0
            for size, made, last, whole in self.values:
                if made < start:
                    if last >= start:
                        held += size
                elif made < stop:
                    if last >= stop:
                        handed += size
                    elif whole and size > temporary:
                        temporary = size
            worst = max(worst, held + handed + temporary)
        return worst

    def candidates(self, least: int) -> set:
        """Cuts right after the last read of a buffer of at least ``least`` bytes."""
        return {last + 1 for size, made, last, _ in self.values
                if size >= least and made < last < self.end - 1}


_getitem = operator.getitem
# Ops XLA computes inside a consumer's fusion (besides elementwise ones): copies and fills.
_FUSIBLE = {torch.ops.aten.clone.default, torch.ops.aten._to_copy.default,
            torch.ops.aten.full.default, torch.ops.aten.full_like.default,
            torch.ops.aten.zeros_like.default, torch.ops.aten.ones_like.default,
            torch.ops.aten.scalar_tensor.default, torch.ops.aten.arange.start_step,
            torch.ops.aten.arange.start, torch.ops.aten.arange.default}


def _is_view(node: fx.Node) -> bool:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    returns = node.target._schema.returns
    return (len(returns) == 1 and returns[0].alias_info is not None
            and not returns[0].alias_info.is_write and bool(node.args)
            and isinstance(node.args[0], fx.Node))


def _fusible(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and (
        torch.Tag.pointwise in target.tags or target in _FUSIBLE)


def _reads_whole(node: fx.Node) -> bool:
    """Whether ``node`` reads its inputs as whole buffers (a matmul, a reduction: XLA fuses no
    producer into it), not through a fusion (an elementwise op, a view) that need not write
    them out."""
    if node.op != "call_function" or node.target is _getitem:
        return False
    return not (_fusible(node) or _is_view(node))


def enabled(platform: str | None) -> bool:
    """Whether backward graphs on ``platform`` may be cut (``config.split_backward``)."""
    from .. import config
    choice = config.split_backward
    return choice == "on" or (choice == "auto" and platform not in (None, "cpu"))


def plan_pieces(gm: fx.GraphModule) -> list | None:
    """A piece index for each compute node of ``gm`` (in graph order), or None where one
    program is estimated as good (module doc) or a size is symbolic.

    Example::

        plan_pieces(gm)          # [0, 0, 0, 1, 1, 2, ...]: three pieces
    """
    live = _Liveness(gm)
    if not live.ok or live.end < 2:
        return None
    cuts: list = []
    peak = live.peak(cuts)
    while len(cuts) + 1 < MAX_PIECES:
        need = max(MIN_SAVING_BYTES, int(peak * MIN_SAVING_SHARE))
        best, best_peak = None, peak - need + 1
        for cut in live.candidates(need) - set(cuts):
            estimate = live.peak(cuts + [cut])
            if estimate < best_peak:
                best, best_peak = cut, estimate
        if best is None:
            break
        cuts.append(best)
        peak = best_peak
    if not cuts:
        return None
    cuts.sort()
    piece, pieces = 0, {}
    for i, node in enumerate(live.compute):
        while piece < len(cuts) and i >= cuts[piece]:
            piece += 1
        # a tuple's parts go with it: a piece hands on tensors, not tuples
        pieces[node] = pieces.get(node.args[0], piece) if node.target is _getitem else piece
    return list(pieces.values())
