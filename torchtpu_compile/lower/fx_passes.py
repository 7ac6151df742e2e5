"""Graph rewrites applied before lowering, one registered function each.

They work around gaps of the FX importer on valid graphs, or spare XLA work it would not spare
itself, in place, without changing results.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .. import config
from .index_checks import INDEX_CHECK, INDEX_CHECK_REAL
from .node_values import set_value

aten = torch.ops.aten
_PASSES: list = []


def fx_pass(fn):
    """Register ``fn(gm) -> None`` to run on every static graph before lowering.

    Example::

        @fx_pass
        def nothing(gm):
            pass
    """
    _PASSES.append(fn)
    return fn


def normalize(gm: fx.GraphModule) -> None:
    """Run every registered rewrite on ``gm``."""
    for fn in _PASSES:
        fn(gm)
    gm.recompile()


def _dim_size(node: fx.Node, dim: int):
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    return val.shape[dim]


def _normalized_bound(value, size: int):
    # Python slice semantics: a negative bound counts from the end; both clamp to [0, size].
    if value is None:
        return None
    if value < 0:
        value += size
    return min(max(value, 0), size)


#: Factories of one value, with where that value is: a number, or the argument at an index.
_FILL_OF = {
    aten.full.default: 1, aten.full_like.default: 1, aten.new_full.default: 2,
    aten.scalar_tensor.default: 0, aten.zeros.default: 0.0, aten.zeros_like.default: 0.0,
    aten.new_zeros.default: 0.0, aten.ones.default: 1.0, aten.ones_like.default: 1.0,
    aten.new_ones.default: 1.0}


def _is_zeros(node) -> bool:
    if not isinstance(node, fx.Node) or node.op != "call_function" or \
            node.target not in _FILL_OF:
        return False
    where = _FILL_OF[node.target]
    if isinstance(where, int):  # the argument at that index
        if len(node.args) <= where or isinstance(node.args[where], fx.Node):
            return False
        where = node.args[where]
    return where == 0


def _positions_along(node, dim: int, size: int) -> bool:
    """Whether ``node`` is arange(size) viewed along ``dim`` (size there, 1 elsewhere)."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.shape[dim] != size or \
            any(s != 1 for d, s in enumerate(val.shape) if d != dim):
        return False
    while node.op == "call_function" and node.target in (aten.view.default,
                                                         aten.reshape.default,
                                                         aten.unsqueeze.default):
        node = node.args[0]
    if node.op != "call_function":
        return False
    if node.target is aten.arange.default:
        return node.args[0] == size
    if node.target is aten.arange.start:
        return node.args[:2] == (0, size)
    return node.target is aten.arange.start_step and tuple(node.args) in (
        (0, size), (0, size, 1))


def _one_hot_product(node: fx.Node):
    """(index, value, scale, dim, size) where ``node`` is ``sum(where(positions == index,
    value, 0) * scale, [dim], keepdim=True)``, positions being arange(size) along ``dim`` (a
    one-hot times what is constant along it), all of one float dtype; None otherwise."""
    if node.target is not aten.sum.dim_IntList or node.kwargs or len(node.args) != 3 or \
            node.args[2] is not True or not isinstance(node.args[1], (list, tuple)) or \
            len(node.args[1]) != 1:  # dim None: a sum over every dim
        return None
    product = node.args[0]
    if not isinstance(product, fx.Node) or product.target is not aten.mul.Tensor or \
            not isinstance(node.meta.get("val"), torch.Tensor):
        return None
    val = product.meta.get("val")
    if not isinstance(val, torch.Tensor) or not val.is_floating_point() or val.dim() < 1:
        return None
    dim = node.args[1][0] % val.dim()
    size = val.shape[dim]
    for one_hot, scale in (product.args, product.args[::-1]):
        if not isinstance(one_hot, fx.Node) or one_hot.target is not aten.where.self or \
                not isinstance(scale, fx.Node):
            continue
        mask, value, zeros = one_hot.args
        if not _is_zeros(zeros) or not isinstance(value, fx.Node) or \
                not isinstance(mask, fx.Node) or mask.target is not aten.eq.Tensor:
            continue
        vals = [n.meta.get("val") for n in (value, zeros, scale)]
        if not all(isinstance(v, torch.Tensor) and v.dtype == val.dtype and (
                v.dim() == 0 or (v.dim() == val.dim() and v.shape[dim] == 1))
                for v in (vals[0], vals[2])) or not isinstance(vals[1], torch.Tensor) or \
                vals[1].dtype != val.dtype:
            continue
        for positions, index in (mask.args, mask.args[::-1]):
            index_val = index.meta.get("val") if isinstance(index, fx.Node) else None
            if isinstance(index_val, torch.Tensor) and index_val.dim() == val.dim() and \
                    index_val.shape[dim] == 1 and _positions_along(positions, dim, size):
                return index, value, scale, dim, size
    return None


def _added(graph: fx.Graph, target, *args) -> fx.Node:
    """A call of ``target`` inserted in ``graph``, its value's metadata computed."""
    new = graph.call_function(target, args)
    new.meta = {"val": target(*[a.meta["val"] if isinstance(a, fx.Node) else a for a in args])}
    return new


@fx_pass
def one_getitem_per_element(gm):
    """Two getitems of one element of a multi-output op read as one: torch-mlir unpacks a
    list once, and a region returning both (CSE had merged two linalg.inv calls whose results
    were both returned) failed to legalize its ListUnpack."""
    import operator
    seen: dict = {}
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is operator.getitem and \
                isinstance(node.args[0], fx.Node):
            first = seen.setdefault((node.args[0], node.args[1]), node)
            if first is not node:
                node.replace_all_uses_with(first)
                gm.graph.erase_node(node)


@fx_pass
def sum_of_one_hot_product(gm):
    # First, before other rewrites widen the one-hot's branches to its shape. The
    # log-softmax backward sums nll_loss's gradient along the classes: a one-hot (the
    # scatter decomposition's select) times a per-row scale. XLA computes that select over
    # every (token, class) and, on the CPU client, writes it out whole for its library
    # reduction: a (tokens x vocabulary) buffer in every language model's training step.
    # The row's one match makes the sum value * scale, plus the row's zeros times the scale
    # (a NaN or infinite scale makes the sum NaN), a zero sum being +0 (a sum starts there);
    # no match (an index out of range) sums the zeros alone.
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        parts = _one_hot_product(node)
        if parts is None:
            continue
        index, value, scale, dim, size = parts
        with graph.inserting_before(node):
            inside = _added(graph, aten.logical_and.default,
                            _added(graph, aten.ge.Scalar, index, 0),
                            _added(graph, aten.lt.Scalar, index, size))
            zeros = _added(graph, aten.mul.Tensor, scale, 0.0)
            match = _added(graph, aten.mul.Tensor, value, scale)
            if size > 1:
                match = _added(graph, aten.add.Tensor, match, zeros)
            total = _added(graph, aten.where.self, inside, match, zeros)
            # a zero sum is +0, whatever its terms' signs (not total + 0.0: XLA folds it)
            total = _added(graph, aten.where.self, _added(graph, aten.eq.Scalar, total, 0),
                           _added(graph, aten.zeros_like.default, total), total)
            total = _added(graph, aten.expand.default, total, list(node.meta["val"].shape))
        node.replace_all_uses_with(total)
        graph.erase_node(node)


@fx_pass
def clamp_slice_bounds(gm):
    # Llama's rotate_half backward slices with end=INT64_MAX (the importer then runs out of
    # memory) and Mistral's sliding-window cache with start=-4095 on a dim of 8 (which
    # legalizes to a scatter with bad bounds). Normalized bounds select the same elements.
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is aten.slice.Tensor:
            source, dim_pos = node.args[0], 1
        elif node.target is aten.slice_scatter.default:
            source, dim_pos = node.args[0], 2
        else:
            continue
        args = list(node.args)
        kwargs = dict(node.kwargs)
        dim = args[dim_pos] if len(args) > dim_pos else kwargs.get("dim", 0)
        size = _dim_size(source, dim)
        if not isinstance(size, int):
            continue
        for offset, key in ((1, "start"), (2, "end")):
            pos = dim_pos + offset
            if len(args) > pos and isinstance(args[pos], int):
                args[pos] = _normalized_bound(args[pos], size)
            elif isinstance(kwargs.get(key), int):
                kwargs[key] = _normalized_bound(kwargs[key], size)
        node.args = tuple(args)
        node.kwargs = kwargs


_EMPTY_OPS = {aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default,
              aten.new_empty.default, aten.new_empty_strided.default}


@fx_pass
def empty_as_zeros(gm):
    # torch-mlir lowers empty to tensor.empty, which XLA cannot compile when it reaches an
    # output. Its contents are unspecified, so zeros are a valid value.
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _EMPTY_OPS:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or not all(isinstance(s, int) for s in val.shape):
            continue
        _replace_with_zeros(gm, node, val)


def _replace_with_zeros(gm, node: fx.Node, val: torch.Tensor) -> None:
    """Put zeros of ``val``'s shape and dtype in place of ``node`` (its meta kept)."""
    with gm.graph.inserting_before(node):
        zeros = gm.graph.call_function(
            aten.zeros.default, (list(val.shape),),
            {"dtype": val.dtype, "device": val.device, "pin_memory": False})
    zeros.meta = dict(node.meta)
    node.replace_all_uses_with(zeros)
    gm.graph.erase_node(node)


def _computes_nothing(node: fx.Node) -> bool:
    """A functional ATen op whose one result has no elements (static shape); a view only
    where no output returns it (an output view keeps its base: calling_convention)."""
    target = node.target
    val = node.meta.get("val")
    return (node.op == "call_function" and isinstance(target, torch._ops.OpOverload)
            and target.namespace in ("aten", "prims")
            and not (target.is_view and any(u.op == "output" for u in node.users))
            and not target._schema.is_mutable and target not in _ZEROS
            and isinstance(val, torch.Tensor) and not val.is_sparse
            and all(isinstance(s, int) for s in val.shape) and val.numel() == 0)


_ZEROS = {aten.zeros.default, aten.new_zeros.default}


@fx_pass
def empty_results_as_zeros(gm):
    # torch-mlir aborts the process (LLVM's report_fatal_error, no exception) legalizing a
    # gather from an operand with a dim of size 0 (nll_loss's weight gather over an empty
    # batch and weight) and XLA rejects other degenerate windows; a slice with no elements
    # read by a reduction legalized with the whole dim (x[:, :0].sum(), fuzz seed 4034). A
    # result with no elements has no values to compute: its shape and dtype are all there
    # is, so zeros of them are it.
    # Index checks stay: they are their own nodes (torchtpu::index_check) on the index.
    for node in list(gm.graph.nodes):
        if not _computes_nothing(node):
            continue
        val = node.meta["val"]
        _replace_with_zeros(gm, node, val)


#: Comparisons of a value with itself that hold for every number but not for NaN.
_REFLEXIVE = {aten.eq.Tensor, aten.le.Tensor, aten.ge.Tensor}


@fx_pass
def compare_with_itself(gm):
    # torch-mlir folds eq(x, x) to true, for floats too: isfinite (eager's x == x &
    # |x| != inf) called NaN finite, silently. x == x is written as not isnan(x).
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _REFLEXIVE or \
                len(node.args) != 2 or node.args[0] is not node.args[1]:
            continue
        val = node.args[0].meta.get("val")
        if not isinstance(val, torch.Tensor) or not val.is_floating_point():
            continue
        with gm.graph.inserting_before(node):
            nan = gm.graph.call_function(aten.isnan.default, (node.args[0],))
            number = gm.graph.call_function(aten.logical_not.default, (nan,))
        nan.meta = {"val": node.meta["val"]}
        number.meta = dict(node.meta)
        node.replace_all_uses_with(number)
        gm.graph.erase_node(node)


@fx_pass
def where_of_one_value(gm):
    # torch-mlir folds where(c, x, x) to x, without the broadcast to c's shape: a 0-d x under
    # a [1] condition gave a [] result where the graph returns [1], and the program failed to
    # build (defer-and-fuse, fuzz seed 1509); x and x.view(-1) of a [1] x are one value there
    # too (seed 3315). Branches narrower than the result are expanded to it first, so that
    # a fold keeps the shape.
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.where.self:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        args = list(node.args)
        for k in (1, 2):
            x = args[k].meta.get("val") if isinstance(args[k], fx.Node) else None
            if isinstance(x, torch.Tensor) and x.shape != val.shape:
                with gm.graph.inserting_before(node):
                    wide = gm.graph.call_function(aten.expand.default, (args[k], list(val.shape)))
                wide.meta = {"val": x.expand(val.shape)}
                args[k] = wide
        node.args = tuple(args)


@torch.library.custom_op("torchtpu::c_fmod", mutates_args=(), tags=(torch.Tag.pointwise,))
def c_fmod(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C's fmod (the dividend's sign), exact, of two tensors of one dtype. Decompositions
    call it for fmod and remainder: torch-mlir lowers ``aten.fmod`` as ``a - trunc(a / b) *
    b`` (fmod(1e20, 3) gave 2.2e12, not 2; fmod(3, inf) NaN, not 3) and ``aten.remainder``
    as StableHLO's exact remainder, C's fmod, not eager's remainder. ``c_fmod_as_remainder``
    lowers it so; where a graph runs in eager PyTorch, this body runs.
    """
    return torch.fmod(a, b)


@c_fmod.register_fake
def _c_fmod_fake(a, b):
    return torch.fmod(a, b)


C_FMOD = torch.ops.torchtpu.c_fmod.default


def _host_device(value):
    if isinstance(value, torch.device) and value.type != "cpu":
        return torch.device("cpu")
    if isinstance(value, (list, tuple)):
        return type(value)(_host_device(v) for v in value)
    return value


@fx_pass
def device_literals_as_host(gm):
    # Graphs traced from tpu tensors carry device="tpu:0" in factory kwargs, which the importer
    # does not know. The program runs on the PJRT device whatever the literal says.
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        node.args = _host_device(node.args)
        node.kwargs = {k: _host_device(v) for k, v in node.kwargs.items()}


@fx_pass
def device_moves_as_copies(gm):
    # A move between the host and the tpu device inside a graph (torch.tensor(..., device=
    # x.device) decomposes to prims.device_put) is no move at all: every input of the program
    # is a PJRT buffer on its one device. A copy (free in XLA) keeps the node's value and the
    # device its result reports; the importer does not know device_put.
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.prims.device_put.default:
            node.target, node.args, node.kwargs = aten.clone.default, node.args[:1], {}


#: Largest literal we evaluate on the host while folding; bigger ones are left to XLA.
_MAX_FOLDED_NUMEL = 1 << 16


def _is_foldable(node: fx.Node) -> bool:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in target.tags or target._schema.is_mutable:
        return False
    val = node.meta.get("val")
    return (isinstance(val, torch.Tensor) and not val.is_complex()
            and all(isinstance(s, int) for s in val.shape) and val.numel() <= _MAX_FOLDED_NUMEL)


def _splat_value(tensor: torch.Tensor):
    """The one value every element of ``tensor`` holds (sign of zero and NaN included), or None."""
    if tensor.numel() == 0:
        return None
    flat = tensor.reshape(-1)
    if tensor.is_floating_point() and tensor.element_size() == 1:
        flat = flat.float()  # float8 (exact in float32), which has no signbit kernel
    first = flat[0]
    same = flat == first
    if tensor.is_floating_point():
        same = (same & (torch.signbit(flat) == torch.signbit(first))) | \
            (torch.isnan(flat) & torch.isnan(first))
    return first.item() if bool(same.all()) else None


#: Ops that read only the shape and dtype of their tensor arguments: full_like(x, 4.0) is a
#: literal whatever x holds (torch-mlir folded lt(full_like(x, 4.0), 1) to true).
_SHAPE_ONLY = {aten.full_like.default, aten.zeros_like.default, aten.ones_like.default,
               aten.new_full.default, aten.new_zeros.default, aten.new_ones.default}


def _shape_stand_in(node: fx.Node) -> torch.Tensor:
    val = node.meta["val"]
    return torch.empty(val.shape, dtype=val.dtype)


def _host_args(value, known):
    if isinstance(value, fx.Node):
        return known[value] if value in known else _shape_stand_in(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_host_args(v, known) for v in value)
    return value


#: Ops that stand for another in a normalized graph, as the host must evaluate them: a graph
#: cut around a fallback op is normalized again piece by piece, and its aten.remainder is
#: c_fmod_as_remainder's C fmod. Folded as eager's remainder, a roll's sign test of
#: remainder(arange(2) - 1, 2) came out false where XLA's -1 needed it (fuzz seed 4208).
_HOST_MEANING = {aten.remainder.Tensor: aten.fmod.Tensor}


@fx_pass
def fold_literal_expressions(gm):
    # torch-mlir's canonicalizer folds arithmetic on literals wrongly, or crashes, for several
    # mixes of dtypes: ge(scalar_tensor(-1.5), -2) folds to false, add(scalar_tensor(2.5), -2)
    # to 2**64 (the int read as unsigned), lt(scalar_tensor(-1, int64), 0.5) segfaults, and some
    # folds differ from process to process. Decompositions such as remainder(x, -1.5) make
    # exactly these graphs. So we fold every expression of literals here, with eager PyTorch on
    # the host, and the importer only ever sees the answer as one literal.
    known: dict = {}   # node -> its value on the host, for nodes made of literals only
    for node in list(gm.graph.nodes):
        if not _is_foldable(node) or not (node.target in _SHAPE_ONLY or
                                          all(n in known for n in node.all_input_nodes)):
            continue
        target = _HOST_MEANING.get(node.target, node.target)
        try:
            value = target(*_host_args(node.args, known), **_host_args(node.kwargs, known))
        except Exception:  # whatever the host cannot evaluate, XLA still may
            continue
        if not isinstance(value, torch.Tensor):
            continue
        known[node] = value
        if node.target in (INDEX_CHECK, INDEX_CHECK_REAL):
            # A literal index that the host found in range (index_checks.py): nothing to check
            # at run time (masks built from arange, position ids).
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
            continue
        if not node.all_input_nodes:
            continue  # a factory: already a single literal
        splat = _splat_value(value)
        if splat is None:
            continue
        # On the node's own device: a graph re-traced at concrete sizes (a data-dependent
        # output) on tpu tensors met a CPU literal there and raised a device mismatch.
        device = getattr(node.meta.get("val"), "device", torch.device("cpu"))
        with gm.graph.inserting_before(node):
            folded = gm.graph.call_function(
                aten.full.default, (list(value.shape), splat),
                {"dtype": value.dtype, "device": device, "pin_memory": False})
        folded.meta = dict(node.meta)
        known[folded] = value
        node.replace_all_uses_with(folded)
        gm.graph.erase_node(node)
    _hold_inexact_literals(gm, known)
    for node in reversed(list(gm.graph.nodes)):  # the literals the folds left unused
        if node in known and not node.users:
            gm.graph.erase_node(node)


def _hold_inexact_literals(gm, known: dict) -> None:
    # A literal computed through floating-point arithmetic (an upsampling's source rows, from
    # arange, a ratio and a float-to-int conversion) is not always what eager computes once
    # XLA compiles it: XLA:CPU always contracts a multiply and an add into one FMA, rounded
    # once, so (4.5 * r - r + 0.5).to(int64) with r = float32(15 / 7) gave 8, not eager's 7,
    # and the scatter it indexed summed into the wrong rows. So each literal that the rest of
    # the graph reads is held as eager's value (an argument, resident), not recomputed by XLA.
    inexact: set = set()  # literals with a floating-point literal among their inputs
    for node in list(gm.graph.nodes):
        if node not in known or not node.all_input_nodes:
            continue  # not a literal, or a factory (arange, full): exact as XLA makes it
        if any(n in inexact or (n in known and known[n].is_floating_point())
               for n in node.all_input_nodes):
            inexact.add(node)
        readers = [user for user in node.users if user not in known]
        if node not in inexact or not readers:
            continue
        name = f"_folded_literal_{node.name}"
        gm.register_buffer(name, known[node].contiguous().clone())
        with gm.graph.inserting_before(node):
            held = gm.graph.get_attr(name)
        held.meta = dict(node.meta)
        for user in readers:
            # A returned literal is copied, so that no caller ever holds the resident constant.
            replacement = held
            if user.op == "output":
                with gm.graph.inserting_after(held):
                    replacement = gm.graph.call_function(aten.clone.default, (held,))
                replacement.meta = dict(node.meta)
            user.replace_input_with(node, replacement)


@fx_pass
def c_fmod_as_remainder(gm):
    # Here, after every decomposition: a graph holding aten.remainder would have it
    # decomposed again into eager's remainder by any later trace (buckets, exact shapes).
    # And after fold_literal_expressions: the host evaluates aten.remainder as eager's
    # (Python's) remainder, not StableHLO's C fmod that it stands for here, so a remainder of
    # literals (``(torch.arange(10) - 7) % 5`` in a graph, a roll's positions) folded its sign
    # test away and gave fmod's -2 for 3 with no error.
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is C_FMOD:
            node.target = aten.remainder.Tensor


#: Dtypes whose literals torch-mlir cannot legalize (torch.vtensor.literal of ui8 or of a
#: complex type).
_HOST_LITERAL_DTYPES = (torch.uint8, torch.complex64)

@fx_pass
def unlegalizable_literals_as_constants(gm):
    # torch-mlir cannot legalize a uint8 or complex literal, and folds a conversion of an int32
    # one back into it: a uint8 full_like, a where with a 0 on uint8, a uint8 scalar in a
    # decomposition ran on the host, and a complex graph with zeros in it (block_diag) failed
    # to lower as a whole. Such a value is made on the host and held by the graph instead,
    # which the calling convention passes in as an argument.
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _FILL_OF:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dtype not in _HOST_LITERAL_DTYPES or \
                not all(isinstance(size, int) for size in val.shape):
            continue
        where = _FILL_OF[node.target]
        fill = node.args[where] if isinstance(where, int) else where
        if isinstance(fill, fx.Node):  # a value computed by the graph
            continue
        name = f"_host_literal_{node.name}"
        gm.register_buffer(name, torch.full(tuple(val.shape), fill, dtype=val.dtype))
        with gm.graph.inserting_before(node):
            held = gm.graph.get_attr(name)
        held.meta = dict(node.meta)
        node.replace_all_uses_with(held)
        gm.graph.erase_node(node)


#: Float arithmetic XLA may merge with a neighbour's rounding: its simplifier reassociates
#: constants ((x + c1) + c2 -> x + (c1 + c2)) and XLA:CPU contracts a * b + c into one FMA.
_ROUNDED_EACH = frozenset({
    aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.mul.Tensor,
    aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar})
#: Ops a float passes through on its way to an index, each rounding (or not) as eager.
_TOWARDS_AN_INDEX = _ROUNDED_EACH | {
    aten.neg.default, aten.floor.default, aten.ceil.default, aten.round.default,
    aten.trunc.default, aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default,
    aten.expand.default, aten.view.default, aten.unsqueeze.default, aten.squeeze.dim,
    aten._to_copy.default, torch.ops.prims.convert_element_type.default}
_TO_DTYPE = (aten._to_copy.default, torch.ops.prims.convert_element_type.default)
#: The meta key marking the adds of -0.0 that round an index's arithmetic.
_ROUNDING = "torchtpu_rounds_per_op"


def _float_value(node) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) and val.dtype in (torch.float32,
                                                                   torch.float64) else None


@fx_pass
def index_arithmetic_rounded_per_op(gm):
    # A float turned into an integer ((a * r - r + 0.5).long(): a position, an index) must
    # round where eager rounds, or one ulp is another index (fuzz seed 3711: 8 where eager's
    # 7.9999995 gives 7). XLA:CPU contracts a * r - r into one FMA (LLVM's FP fusion, always
    # on) and its simplifier folds -r + 0.5 into one constant; no per-compile option turns
    # either off, and XLA drops optimization barriers and float64 round trips before they
    # could help. Adding a -0.0 that XLA cannot see (a resident argument) after each rounded
    # op of such a chain is exact (x + -0.0 is x, -0.0 and NaN included) and stops both: the
    # FMA takes the -0.0 and rounds the product alone, and no constant meets a constant.
    # _hold_inexact_literals does the same job for chains of literals, by evaluating them.
    if not config.exact_index_arithmetic:
        return
    chain, todo = set(), []
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "call_function" and node.target in _TO_DTYPE and \
                isinstance(val, torch.Tensor) and not val.is_floating_point() and \
                val.dtype != torch.bool and _float_value(node.args[0]) is not None:
            todo.append(node.args[0])
    while todo:
        node = todo.pop()
        if node in chain or node.op != "call_function" or node.target not in _TOWARDS_AN_INDEX \
                or _float_value(node) is None:
            continue
        chain.add(node)
        todo.extend(node.all_input_nodes)
    zeros: dict = {}
    for node in [n for n in gm.graph.nodes if n in chain and n.target in _ROUNDED_EACH]:
        readers = [u for u in node.users if u in chain and u.target in _ROUNDED_EACH]
        if not readers or node.meta.get(_ROUNDING) or \
                any(u.meta.get(_ROUNDING) for u in node.users):
            continue  # nothing rounds next, or done already (a cut graph is normalized again)
        dtype = _float_value(node).dtype
        if dtype not in zeros:
            name = f"_negative_zero_{str(dtype).split('.')[-1]}"
            gm.register_buffer(name, torch.tensor(-0.0, dtype=dtype))
            with gm.graph.inserting_before(node):
                zeros[dtype] = gm.graph.get_attr(name)
            # Its value and tensor_meta, as a placeholder needs them: a graph cut around an
            # eager fallback hands the constant to the next piece as an input, and an empty
            # tensor without tensor_meta failed torch-mlir's import ("Could not deduce type").
            set_value(zeros[dtype], torch.tensor(-0.0, dtype=dtype))
        with gm.graph.inserting_after(node):
            rounded = gm.graph.call_function(aten.add.Tensor, (node, zeros[dtype]))
        rounded.meta = {**node.meta, _ROUNDING: True}
        for user in readers:
            user.replace_input_with(node, rounded)
