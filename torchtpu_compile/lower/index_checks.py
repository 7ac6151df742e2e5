"""Index bounds checks: an index out of range raises as in eager PyTorch, on every path.

XLA's gather clamps indices out of range and its scatter drops them, silently; eager PyTorch
raises. A program cannot raise on a data value, so the check leaves it as an output:

1. While a graph is decomposed (aot_autograd, the eager device's tracing, AOT export: the one
   table of ``decompositions/``), each indexing op the *user's program* calls passes its index
   tensors through ``torchtpu::index_check``, an identity that records the op, the dim and its
   size. Registered per op with ``@index_rule``. Indexing that decompositions build themselves
   (upsampling's ``_unsafe_index``, the scatter inside ``index_put``) is in range by
   construction, and backward formulas index with the forward op's indices, checked there:
   neither is marked, neither costs anything. The user's own backward code (an
   ``autograd.Function``'s backward, a tensor hook) is marked: its indices are new.
2. ``calling_convention.prepare`` calls ``lower_marks``: each mark is replaced by its index, and
   a few ops computing (1, the first index out of range) or (0, 0) are added; the pairs of a
   graph are stacked into one extra program output, recorded as an ``OutputSlot("check")``.
3. ``index_errors`` reads that output and raises eager's exception (see there for when).

A graph without indexing ops is unchanged and pays nothing. ``config.check_indices = False``
(env ``TORCHTPU_CHECK_INDICES=0``) builds programs without the checks.

Example::

    torch.compile(lambda w, i: w[i], backend="torchtpu")(torch.ones(4), torch.tensor([5]))
    # IndexError: index 5 is out of bounds for dimension 0 with size 4 (aten.index: ..., at ...)
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import guard_or_false

from ..index_errors import DIVISOR_OPS, eager_error

aten = torch.ops.aten


@torch.library.custom_op("torchtpu::index_check", mutates_args=())
def index_check(index: torch.Tensor, size: int, dim: int, wraps: bool, op: str,
                ignore: int | None = None) -> torch.Tensor:
    """``index`` unchanged, after checking it against ``size`` as ``op`` does in eager.

    In programs it never runs (``lower_marks`` replaces it); this body runs where a graph is
    executed by eager PyTorch (a fallback region, a numerics replay).
    """
    flat = index.reshape(-1).to(torch.int64)
    bad = _out_of_range(flat, size, wraps, ignore, op in DIVISOR_OPS)
    if bool(bad.any()):
        raise eager_error(op, int(flat[bad.nonzero()[0, 0]]), dim, size)
    return index.clone()


@index_check.register_fake
def _index_check_fake(index, size, dim, wraps, op, ignore=None):
    return torch.empty_like(index)


INDEX_CHECK = torch.ops.torchtpu.index_check.default


@torch.library.custom_op("torchtpu::index_check_real", mutates_args=())
def index_check_real(index: torch.Tensor, size: torch.Tensor, dim: int, wraps: bool, op: str,
                     ignore: int | None = None) -> torch.Tensor:
    """``index_check`` against a size known only at run time (``size``, a 0-d int64 tensor):
    a padded graph's dynamic dim, whose real size a bucket's program takes as an input
    (``buckets/rules.py``). Lowered as ``index_check`` is, its row holding 1 + the size."""
    return index_check(index, int(size), dim, wraps, op, ignore)


@index_check_real.register_fake
def _index_check_real_fake(index, size, dim, wraps, op, ignore=None):
    return torch.empty_like(index)


INDEX_CHECK_REAL = torch.ops.torchtpu.index_check_real.default


def _out_of_range(flat, size: int, wraps: bool, ignore, divisor: bool = False):
    if divisor:
        return flat == 0
    bad = (flat < (-size if wraps else 0)) | (flat >= size)
    if ignore is not None:
        bad = bad & (flat != ignore)
    return bad


# --- 1. marking the indices of the ops the user calls ------------------------------------------

_RULES: dict = {}
_KEYWORD_RULES: set = set()  # rules that read the op's keyword arguments too


def index_rule(*ops, keywords: bool = False):
    """Register ``fn(*args) -> args``: the op's positional arguments with its indices marked;
    with ``keywords``, ``fn(*args, **kwargs) -> (args, kwargs)``, for a rule that reads or
    marks a keyword-only argument (``div``'s ``rounding_mode``, ``searchsorted``'s ``sorter``).

    Example::

        @index_rule(aten.gather.default)
        def gather(x, dim, index, *rest):
            return (x, dim, mark(index, x, dim, "aten.gather"), *rest)
    """
    def register(fn):
        for op in ops:
            _RULES[op] = fn
        if keywords:
            _KEYWORD_RULES.add(fn)
        return fn
    return register


def mark(index, source, dim: int | None, op: str, wraps: bool = False, ignore=None,
         named_dim: int | None = None):
    """``index`` passed through ``torchtpu::index_check`` against ``source``'s dim ``dim``
    (None: its flat element count); unmarked where nothing can be out of range.

    ``named_dim``: the dim eager's message names, where it is not ``dim`` (aten.index counts
    only the indexed dims).
    """
    if not _checkable(index):
        return index
    if dim is None:
        size, dim = source.numel(), 0
    else:
        dim = dim % source.dim() if source.dim() else 0
        size = source.shape[dim] if source.dim() else 1
    return index_check(index, size, dim if named_dim is None else named_dim, wraps, op, ignore)


def _checkable(index) -> bool:
    """Whether ``index`` holds indices to check: a tensor of integers with elements (boolean
    masks select; their shape is checked when traced). A length the data decides (under
    capture_dynamic_output_shape_ops) cannot be asked whether it is 0: checked."""
    return isinstance(index, torch.Tensor) and index.dtype not in (torch.bool, torch.uint8) \
        and not guard_or_false(index.numel() == 0)


def _has_empty_dim(x, besides=()) -> bool:
    """Whether a dim of ``x`` other than ``besides`` has size 0. Eager's kernels of
    index_add (of a matrix), index_copy, index_fill, ``x[i]`` and index_put then touch no
    element and check no index (fuzz seed 5182: ``index_add`` of index -1 into a (2, 0)
    tensor returns it). A symbolic size is never 0 (Dynamo specializes 0), so this adds no
    guard."""
    return any(isinstance(s, int) and s == 0 for d, s in enumerate(x.shape) if d not in besides)


def _marked_indices(x, indices, op: str) -> list:
    """aten.index / index_put's index list, marked; a boolean mask spans its own dims. Left
    unmarked where a dim no index covers is empty: the result has no element to read or write.
    """
    covered, dim = set(), 0
    for i in indices:
        span = 1 if i is None or i.dtype not in (torch.bool, torch.uint8) else i.dim()
        if i is not None:
            covered.update(range(dim, dim + span))
        dim += span
    if _has_empty_dim(x, besides=covered):
        return list(indices)
    marked, dim, indexed = [], 0, 0
    for i in indices:
        if i is not None and i.dtype in (torch.bool, torch.uint8):
            marked.append(i)
            dim += i.dim()
            indexed += i.dim()
            continue
        if i is not None:
            i = mark(i, x, dim, op, wraps=True, named_dim=indexed)
            indexed += 1
        marked.append(i)
        dim += 1
    return marked


@index_rule(aten.index.Tensor)
def _index(x, indices):
    return (x, _marked_indices(x, indices, "aten.index"))


@index_rule(aten.index_put.default)
def _index_put(x, indices, values, *rest):
    return (x, _marked_indices(x, indices, "aten.index_put"), values, *rest)


def _selected(x, dim: int, index, name: str):
    """index_select's (and embedding's) index marked. Of a matrix with no element, eager's
    CPU kernel raises RuntimeError with messages of its own: "self indexing axis dim should be
    positive" for any index into an empty ``dim``, "INDICES element is out of DATA bounds" for
    one out of range of another."""
    if x.dim() > 1 and _has_empty_dim(x):
        empty_dim = isinstance(x.shape[dim], int) and x.shape[dim] == 0
        name = "aten.index_select.empty_dim" if empty_dim else "aten.index_select.no_elements"
    return mark(index, x, dim, name)


@index_rule(aten.embedding.default)
def _embedding(weight, indices, *rest):
    return (weight, _selected(weight, 0, indices, "aten.embedding"), *rest)


@index_rule(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag(weight, indices, offsets, *rest):
    # Eager also refuses offsets that do not start at 0 or end past the input (a bag would
    # take no index before it, or indices that are not there).
    if isinstance(offsets, torch.Tensor) and offsets.dim() == 1 and offsets.numel():
        first = offsets[:1]
        offsets = torch.cat([mark(first, first, 0, "aten.embedding_bag.offsets"), offsets[1:]])
        length = indices.shape[0] if indices.dim() == 1 else None
        if isinstance(length, int):
            last = index_check(offsets[-1:], length + 1, 0, False,
                               "aten.embedding_bag.offsets_end")
            offsets = torch.cat([offsets[:-1], last])
    return (weight, mark(indices, weight, 0, "aten.embedding_bag"), offsets, *rest)


def _dim_rule(name: str, wraps: bool = False, skips_empty: bool = False):
    """The rule of an op taking (self, dim, index, ...); ``skips_empty``: eager checks no
    index where another dim of self is empty (``_has_empty_dim``)."""
    def rule(x, dim, index, *rest):
        if skips_empty and x.dim() and _has_empty_dim(x, besides=(dim % x.dim(),)):
            return (x, dim, index, *rest)
        return (x, dim, mark(index, x, dim, name, wraps=wraps), *rest)
    return rule


index_rule(aten.gather.default)(_dim_rule("aten.gather"))
index_rule(aten.scatter.src, aten.scatter.value, aten.scatter.reduce,
           aten.scatter.value_reduce)(_dim_rule("aten.scatter"))
index_rule(aten.scatter_add.default)(_dim_rule("aten.scatter_add"))
index_rule(aten.scatter_reduce.two)(_dim_rule("aten.scatter_reduce"))


@index_rule(aten.index_select.default)
def _index_select(x, dim, index):
    return (x, dim, _selected(x, dim % max(x.dim(), 1), index, "aten.index_select"))


index_rule(aten.index_copy.default)(_dim_rule("aten.index_copy", skips_empty=True))
index_rule(aten.index_reduce.default)(_dim_rule("aten.index_reduce"))
index_rule(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)(
    _dim_rule("aten.index_fill", wraps=True, skips_empty=True))


@index_rule(aten.index_add.default)
def _index_add(x, dim, index, *rest):
    # Eager's kernel checks a vector's (or a 0-d tensor's) indices itself, with IndexError
    # "index out of range in self", and leaves a matrix's to the scatter it runs (RuntimeError
    # naming the index: what every other op of _dim_rule raises; fuzz seed 4875).
    # A matrix with no element (its dim ``dim`` empty too) is returned before any check.
    if x.dim() > 1 and _has_empty_dim(x):
        return (x, dim, index, *rest)
    name = "aten.index_add.vector" if x.dim() <= 1 else "aten.index_add"
    return (x, dim, mark(index, x, dim, name), *rest)


@index_rule(aten.take.default)
def _take(x, index):
    return (x, mark(index, x, None, "aten.take", wraps=True))


@index_rule(aten.put.default)
def _put(x, index, *rest):
    return (x, mark(index, x, None, "aten.put", wraps=True), *rest)


@index_rule(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def _nll_loss(x, target, weight, reduction, ignore_index):
    classes = 1 if x.dim() >= 2 else 0
    return (x, mark(target, x, classes, "aten.nll_loss", ignore=ignore_index), weight,
            reduction, ignore_index)


@index_rule(aten.multi_margin_loss.default)
def _multi_margin_loss(x, target, *rest):
    return (x, mark(target, x, x.dim() - 1, "aten.multi_margin_loss"), *rest)


@index_rule(aten.multilabel_margin_loss_forward.default)
def _multilabel_margin_loss(x, target, reduction):
    # A row's targets end at its first -1; eager checks every value, after it too.
    return (x, mark(target, x, x.dim() - 1, "aten.multilabel_margin_loss", ignore=-1),
            reduction)


def _unpooled(indices, output_size):
    """max_unpool's indices (flat positions in one output plane), marked against the plane."""
    plane = 1
    for size in output_size:
        plane *= size
    if not isinstance(plane, int) or not _checkable(indices):
        return indices
    sizes = "x".join(str(size) for size in output_size)
    return index_check(indices, plane, 0, False, f"aten.max_unpool:{sizes}")


@index_rule(aten.max_unpool2d.default, aten.max_unpool3d.default)
def _max_unpool(x, indices, output_size, *rest):
    return (x, _unpooled(indices, output_size), output_size, *rest)


@index_rule(aten.searchsorted.Tensor, aten.searchsorted.Scalar, keywords=True)
def _searchsorted(sorted_sequence, values, **options):
    sorter = options.get("sorter")
    if sorter is not None:
        options["sorter"] = mark(sorter, sorted_sequence, -1, "aten.searchsorted.sorter")
    return (sorted_sequence, values), options


def _tied_to_values_check(x, codes, op: str):
    """``x`` with a check of ``codes`` tied to it: a value check, not an index one
    (``index_errors._VALUE_ERRORS``: 0 where eager's kernel accepts the data, else the code of
    the error it raises). Tied by adding the checked codes times 0, which keeps the check in
    the graph (and XLA folds away), as a divisor that is a number is (``_mark_divisor``)."""
    checked = index_check(codes.to(torch.int64), 1, 0, False, op)
    return x + (checked * 0).to(x.dtype)


def _outside_unit_interval(p):
    return ~((p >= 0) & (p <= 1))  # NaN too, as eager's check


@index_rule(aten.binary_cross_entropy.default)
def _binary_cross_entropy(x, target, *rest):
    # Eager's CPU kernel raises for a probability outside [0, 1] (CUDA's asserts), element by
    # element, the input's before the target's; XLA's log returned NaN, or a loss for a target.
    codes = torch.where(_outside_unit_interval(x), 1,
                        torch.where(_outside_unit_interval(target), 2, 0))
    return (_tied_to_values_check(x, codes, "aten.binary_cross_entropy"), target, *rest)


@index_rule(aten.masked_scatter.default)
def _masked_scatter(x, mask, source):
    # Eager raises where the mask selects more elements than the source holds; XLA's gather
    # clamped, and the last source element filled the rest.
    if any(isinstance(s, torch.SymInt) for s in (*x.shape, *mask.shape, *source.shape)):
        return x, mask, source
    ones = torch.broadcast_to(mask, torch.broadcast_shapes(x.shape, mask.shape)).sum()
    return _tied_to_values_check(x, ones > source.numel(), "aten.masked_scatter"), mask, source


@index_rule(aten.segment_reduce.default, keywords=True)
def _segment_reduce(data, reduce, **options):
    # Eager's kernel raises for a segment of negative length and, unless unsafe, for lengths
    # that do not add up to the axis; the decomposition reduced whatever they said.
    lengths, offsets = options.get("lengths"), options.get("offsets")
    if options.get("indices") is not None or (lengths is None and offsets is None):
        return (data, reduce), options
    if lengths is not None:
        count = lengths
    else:
        segments = offsets.shape[-1] - 1
        count = offsets.narrow(-1, 1, segments) - offsets.narrow(-1, 0, segments)
    if guard_or_false(count.numel() == 0):
        return (data, reduce), options
    negative = (count < 0).any()
    if lengths is not None and not options.get("unsafe", False):
        axis = options.get("axis", 0) % data.dim()
        short = (lengths.sum(-1) != data.shape[axis]).any()
        codes = torch.where(negative, 1, torch.where(short, 2, 0))
    else:
        codes = torch.where(negative, 3, 0)
    return (_tied_to_values_check(data, codes, "aten.segment_reduce"), reduce), options


def _ends_code(ends):
    """A range's two ends (a 2-element tensor) as one code: their float32 bits, the low end
    in the high word, for eager's message (``index_errors._VALUE_ERRORS``)."""
    bits = ends.to(torch.float32).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return bits[0] * 2**32 + bits[1]


def _checked_data_range(x, op: str):
    """``x`` tied to a check that its range (min, max) is finite, the code holding both ends
    as float32 bits for eager's message; ``x`` itself where it has no element."""
    if not x.is_floating_point() or guard_or_false(x.numel() == 0):
        return x
    ends = torch.stack([x.min(), x.max()])
    return _tied_to_values_check(x, torch.where(ends.isfinite().all(), 0, _ends_code(ends)), op)


@index_rule(aten.histc.default)
def _histc(x, bins=100, min=0, max=0):
    # With no range given, eager's kernel takes the data's and raises where it is not finite
    # (a NaN or an infinity in the data); the bins counted from it were garbage.
    if min == max:
        x = _checked_data_range(x, "aten.histc")
    return x, bins, min, max


@index_rule(aten.histogram.bin_ct, keywords=True)
def _histogram(x, bins=100, **options):
    # As histc: eager raises for data whose range is not finite; the edges were NaN. A range
    # given that is not finite, or runs backwards, eager refuses too (the counts were all 0);
    # its ends are the eager device's program inputs, so they are checked in the program.
    given = options.get("range")
    if given is None:
        x = _checked_data_range(x, "aten.histogram")
    elif x.is_floating_point():
        ends = torch.stack([torch.full((), float(end), dtype=torch.float32) for end in given])
        code = _ends_code(ends)
        x = _tied_to_values_check(x, torch.where(ends.isfinite().all(), 0, code),
                                  "aten.histogram")
        x = _tied_to_values_check(x, torch.where(ends[0] > ends[1], code, 0),
                                  "aten.histogram.backwards")
    return (x, bins), options


def _mark_divisor(x, divisor, op: str) -> tuple:
    """(dividend, divisor) of an integer division, the divisor marked for eager's error on a
    zero; a number that is zero raises at once (eager: "ZeroDivisionError"). A dividend with
    no element divides nothing: eager's kernel raises for no divisor then (fuzz seed 5313)."""
    dtype = torch.result_type(x, divisor)
    if dtype.is_floating_point or dtype.is_complex:
        return x, divisor  # IEEE division: inf or nan, no error
    if isinstance(x, torch.Tensor) and _has_empty_dim(x):
        return x, divisor
    if isinstance(divisor, torch.SymInt):
        # A dynamic int (``a // s`` under dynamic=True) stays a number for the op, and is
        # checked as a tensor tied into the dividend (+ 0 * it, which XLA folds away);
        # comparing the number itself would specialize the graph. It went unchecked: x // 0
        # gave -1 where eager raises.
        mark = index_check(torch.scalar_tensor(divisor, dtype=torch.int64), 0, 0, False, op)
        return x + mark * 0, divisor
    if not isinstance(divisor, torch.Tensor):
        if isinstance(divisor, (bool, int, float)) and _wrapped(divisor, dtype) == 0:
            raise RuntimeError("ZeroDivisionError")
        return x, divisor
    if divisor.numel() == 0:
        return x, divisor
    if divisor.dtype != dtype and divisor.dim() == 0:
        # A number lifted as an int64 input (the eager device), read in the dividend's dtype
        # as eager's kernel reads it: uint8 // 256 divides by 0 and raises.
        divisor = divisor.to(dtype)
    return x, index_check(divisor, 0, 0, False, op)


def _wrapped(number, dtype: torch.dtype):
    """``number`` as an integer kernel of ``dtype`` reads it: wrapped to its width (eager's
    ``uint8 // 256`` divides by 0)."""
    if isinstance(number, float) or dtype is torch.bool:
        return number
    bits = torch.iinfo(dtype).bits
    value = int(number) % (1 << bits)
    return value - (1 << bits) if dtype.is_signed and value >= 1 << (bits - 1) else value


def _divisor_rule(name: str):
    """The rule of an op taking (dividend, divisor)."""
    def rule(x, divisor):
        return _mark_divisor(x, divisor, name)
    return rule


index_rule(aten.floor_divide.default, aten.floor_divide.Scalar)(
    _divisor_rule("aten.floor_divide"))
index_rule(aten.remainder.Tensor, aten.remainder.Scalar)(_divisor_rule("aten.remainder"))
index_rule(aten.fmod.Tensor, aten.fmod.Scalar)(_divisor_rule("aten.fmod"))


@index_rule(aten.div.Tensor_mode, aten.div.Scalar_mode, keywords=True)
def _div_mode(x, divisor, rounding_mode=None):
    if rounding_mode is not None:  # None: true division, a float result for integers too
        x, divisor = _mark_divisor(x, divisor, "aten.div")
    return (x, divisor), {"rounding_mode": rounding_mode}


_marking = threading.local()   # .mode: "off" (unchecked), "ops" (one_op_at_a_time)


@contextlib.contextmanager
def _marking_mode(mode: str):
    previous = getattr(_marking, "mode", None)
    _marking.mode = "off" if previous == "off" else mode  # unchecked() holds inside
    try:
        yield
    finally:
        _marking.mode = previous


def marking_mode() -> str | None:
    """This thread's marking mode while tracing: "off" (``unchecked``), "ops"
    (``one_op_at_a_time``) or None (a whole graph); a graph traced once is reused under the
    same mode only (a cache key part).

    Example::

        with unchecked():
            assert marking_mode() == "off"
    """
    return getattr(_marking, "mode", None)


def unchecked():
    """Trace without marking: for graphs whose indices are ours and in range by construction
    (the eager device's view reads and writes), or are marked already (a graph traced again
    at a bucket's shape, whose marks the padding rules carry over).

    Example::

        with unchecked():
            graph = trace(lambda base: (base.reshape(-1)[positions],), ...)
    """
    return _marking_mode("off")


def one_op_at_a_time():
    """Trace one op (the eager device): marked even when the autograd engine runs it, since
    its graph is kept per signature and may serve the user's own call of the same op later.
    """
    return _marking_mode("ops")


def _called_by_user() -> bool:
    """Whether the op being decomposed was called by the traced program itself, not by another
    op's decomposition (whose indices are in range by construction) nor, in a whole graph, by a
    backward formula (whose indices are the forward op's, checked there)."""
    mode = getattr(_marking, "mode", None)
    if mode == "off":
        return False
    node = torch._C._current_autograd_node()
    if mode != "ops" and node is not None and not _user_code_in_backward(node):
        return False
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    proxy = get_proxy_mode()
    return proxy is None or getattr(proxy, "decomp_layers", 0) <= 1


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # torchtpu_compile
_LIBRARY_DIRS = tuple(d + os.sep for d in (
    os.path.dirname(torch.__file__), _PACKAGE,
    os.path.join(os.path.dirname(_PACKAGE), "torchtpu_eager")))


def _user_code_in_backward(node) -> bool:
    """Whether the user's own code calls the op being decomposed in a backward (under autograd
    ``node``): an ``autograd.Function``'s backward (Dynamo hands it over as a graph, run by
    torch's code) or a tensor hook. Its indices are new, checked nowhere else: an index out
    of range there gave gradients from clamped indices. A backward formula is C++ under a
    node of its own; torch's and our Python are libraries."""
    from torch.autograd.function import BackwardCFunction
    from torch.autograd.graph import _engine_run_backward
    if isinstance(node, BackwardCFunction):
        return True
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code is _engine_run_backward.__code__:
            return False
        if not code.co_filename.startswith(_LIBRARY_DIRS + ("<frozen ", "<string>")):
            return True
        frame = frame.f_back
    return False


def _checked(op, rule, inner):
    def decompose(*args, **kwargs):
        if _called_by_user():
            if rule in _KEYWORD_RULES:
                args, kwargs = rule(*args, **kwargs)
            else:
                args = rule(*args)
            result = NotImplemented if inner is None else inner(*args, **kwargs)
            # Traced as the op itself (no decomposition, or one declining these inputs): with
            # the marked indices, re-entering one layer down.
            return op(*args, **kwargs) if result is NotImplemented else result
        elif inner is None:
            return NotImplemented
        return inner(*args, **kwargs)
    decompose.__name__ = f"checked_{op.__name__.replace('.', '_')}"
    return decompose


def with_index_checks(table: dict) -> dict:
    """``table`` with each indexing op's decomposition marking its indices first."""
    for op, rule in _RULES.items():
        table[op] = _checked(op, rule, table.get(op))
    return table


# --- 2. marks -> one program output ----------------------------------------------------------

def _first_bad(index, size, wraps: bool, ignore, divisor: bool = False):
    """(whether an index is out of range, the first such index or 0), traced into the check
    graphs below; ``size`` an int or a 0-d tensor; ``divisor``: a zero is what fails."""
    flat = index.reshape(-1).to(torch.int64)
    count = flat.shape[0]
    positions = torch.arange(count, dtype=torch.int64)
    # ``count`` appended: the minimum of no index (an expert that got no token) is "none".
    first_bad = torch.cat([torch.where(_out_of_range(flat, size, wraps, ignore, divisor),
                                       positions, count),
                           torch.full((1,), count, dtype=torch.int64)]).amin()
    return first_bad < count, torch.where(positions == first_bad, flat, 0).sum()


@functools.lru_cache(maxsize=512)
def _first_out_of_range(shape: tuple, dtype, size: int, wraps: bool, ignore,
                        divisor: bool = False) -> fx.GraphModule:
    """A graph: index -> int64[2], (1, the first index out of range) or (0, 0)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import make_fx

    def first(index):
        found, value = _first_bad(index, size, wraps, ignore, divisor)
        return torch.stack([found.to(torch.int64), value])

    # Traced alone: inside a compile, make_fx would take Dynamo's fake mode, with symbolic sizes.
    with torch._guards.tracing(None), unset_fake_temporarily():
        return make_fx(first, tracing_mode="fake")(torch.empty(shape, dtype=dtype))


@functools.lru_cache(maxsize=512)
def _first_out_of_real_range(shape: tuple, dtype, wraps: bool, ignore,
                             divisor: bool = False) -> fx.GraphModule:
    """A graph: (index, size: int64[]) -> int64[2], (1 + size, the first index out of range)
    or (0, 0): the size is only known at run time, and eager's message names it."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import make_fx

    def first(index, size):
        found, value = _first_bad(index, size, wraps, ignore, divisor)
        return torch.stack([torch.where(found, size + 1, 0), value])

    with torch._guards.tracing(None), unset_fake_temporarily():
        return make_fx(first, tracing_mode="fake")(torch.empty(shape, dtype=dtype),
                                                    torch.empty((), dtype=torch.int64))


def _insert(graph: fx.Graph, check: fx.GraphModule, *inputs: fx.Node) -> fx.Node:
    env: dict = {}
    result = None
    placeholders = iter(inputs)
    for node in check.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(placeholders)
        elif node.op == "output":
            result = env[node.args[0]]
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    return result


def _where(node: fx.Node) -> str:
    """The user's source line, else the module that made the node (a model compiled whole has
    no frame of the user's in its stack traces)."""
    from .support import source_line
    line = source_line(node)
    modules = node.meta.get("nn_module_stack")
    if line.startswith("unknown") and modules:
        path, kind = list(modules.values())[-1]
        return f"module {path} ({getattr(kind, '__name__', kind)})"
    return line


def lower_marks(gm: fx.GraphModule, check: bool = True):
    """Replace each ``index_check`` mark of ``gm`` by its index; with ``check``, add the ops
    computing each mark's (failed, first index out of range).

    Returns (the node of all pairs stacked, int64[k, 2], or None; the k specs: op, dim, size,
    source line, and the fused-graph entry the mark came from). ``gm`` is changed in place.
    """
    graph = gm.graph
    pairs, specs = [], []
    for node in [n for n in graph.nodes if n.op == "call_function" and
                 n.target in (INDEX_CHECK, INDEX_CHECK_REAL)]:
        index, size, dim, wraps, op, *rest = node.args
        ignore = rest[0] if rest else node.kwargs.get("ignore")
        node.replace_all_uses_with(index)
        val = index.meta.get("val")
        real = node.target is INDEX_CHECK_REAL  # size: a node, the dim's size at run time
        if check and (real or isinstance(size, int)) and \
                isinstance(val, torch.Tensor) and all(isinstance(s, int) for s in val.shape):
            divisor = op in DIVISOR_OPS
            with graph.inserting_before(node):
                if real:  # the row's flag is 1 + the size (index_errors reads it)
                    pairs.append(_insert(graph, _first_out_of_real_range(
                        tuple(val.shape), val.dtype, wraps, ignore, divisor), index, size))
                else:
                    pairs.append(_insert(graph, _first_out_of_range(
                        tuple(val.shape), val.dtype, size, wraps, ignore, divisor), index))
            specs.append({"op": op, "dim": dim, "size": None if real else size,
                          "where": _where(node), "entry": node.meta.get("torchtpu_entry")})
        graph.erase_node(node)
    if not pairs:
        return None, []
    with graph.inserting_before(graph.output_node()):
        stacked = graph.call_function(aten.stack.default, (pairs,))
    with pairs[0].meta["val"].fake_mode:  # each pair was traced in a fake mode of its own
        stacked.meta["val"] = torch.empty((len(pairs), 2), dtype=torch.int64)
    return stacked, specs
