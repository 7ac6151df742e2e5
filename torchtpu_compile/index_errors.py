"""Raising, as eager PyTorch does, for the indices out of range that a program found.

XLA clamps a gather's indices and drops a scatter's; eager PyTorch raises. A program cannot raise
on a data value, so ``lower/index_checks.py`` adds to each program that indexes with tensor data
one output: per checked index tensor, (1, the first index out of range) or (0, 0). This module
reads that output and raises eager's exception (``IndexError`` or ``RuntimeError``, eager's
message) naming the op, the dim's size and the user's source line:

- results that come back as host tensors: checked before the call returns (``check_now``);
- results that stay on the device (eager tpu tensors, compiled graphs on them): the output is
  kept (``defer``) and read at the next synchronization point (a download, ``.item()``,
  printing, ``torch.tpu.synchronize()``), which calls ``raise_pending``. The error is raised
  once, then cleared: the next correct call works.

It imports nothing heavy: the AOT loader uses it.

Example::

    check_now(buffer, [{"op": "aten.embedding", "dim": 0, "size": 4, "where": "m.py:3: e(i)"}])
    # IndexError: index out of range in self (aten.embedding: index 5, dim 0 of size 4, ...)
"""
from __future__ import annotations

import os
import sys
import threading

#: Eager's exception and message per op (the checked op the user called).
_EAGER_ERRORS = {
    "aten.index": (IndexError, "index {value} is out of bounds for dimension {dim} with size "
                               "{size}"),
    "aten.index_put": (IndexError, "index {value} is out of bounds for dimension {dim} with "
                                   "size {size}"),
    "aten.index_fill": (IndexError, "index {value} is out of bounds for dimension {dim} with "
                                    "size {size}"),
    "aten.index_copy": (IndexError, "index_copy_(): index {value} is out of bounds for "
                                    "dimension {dim} with size {size}"),
    "aten.embedding": (IndexError, "index out of range in self"),
    "aten.index_select": (IndexError, "index out of range in self"),
    # index_select (and embedding) of a matrix with no element (lower/index_checks.py)
    "aten.index_select.empty_dim": (RuntimeError, "index_select(): self indexing axis dim "
                                                  "should be positive"),
    "aten.index_select.no_elements": (RuntimeError, "INDICES element is out of DATA bounds, "
                                                    "id={value} axis_dim={size}"),
    "aten.index_reduce": (IndexError, "index out of range in self"),
    "aten.index_add.vector": (IndexError, "index out of range in self"),
    "aten.take": (IndexError, "out of range: tried to access index {value} on a tensor of "
                              "{size} elements."),
    "aten.put": (IndexError, "out of range: tried to access index {value} on a tensor of "
                             "{size} elements."),
    "aten.nll_loss": (IndexError, "Target {value} is out of bounds."),
    "aten.multi_margin_loss": (RuntimeError, "target out of range"),
    "aten.multilabel_margin_loss": (RuntimeError, "argument #2 'target' is out of range"),
    # A flat position in one output plane, whose sizes the op's name carries after a colon
    # ("aten.max_unpool:4x4"): eager's message names them.
    "aten.max_unpool": (RuntimeError, "Found an invalid max index: {value} (output volumes "
                                      "are of size {detail})"),
    "aten.searchsorted.sorter": (RuntimeError, "torch.searchsorted(): sorter index out of "
                                               "range"),
    # CPU's general kernel's (its fast float sum and mean say it otherwise, by position).
    "aten.embedding_bag": (RuntimeError, "embedding_bag: Expected idx >= 0 && idx < "
                                         "num_embeddings but found idx to be {value}"),
    # Its offsets' first value, checked as an index into a range of one: 0 is the only one.
    "aten.embedding_bag.offsets": (RuntimeError, "offsets[0] has to be 0, i.e., the first "
                                                 "sequence in the mini-batch has to start "
                                                 "from position 0. However, got {value}"),
    # Its offsets' last value, checked against a range of the input's length + 1.
    "aten.embedding_bag.offsets_end": (RuntimeError, "offsets[-1] can not be greater than "
                                                     "input's length {length} but got "
                                                     "offsets[-1] of {value}"),
}
#: Ops whose checked tensor is an integer divisor, not an index (lower/index_checks.py marks
#: them): eager's integer kernels raise for a zero, XLA's division returns a value (-1, or the
#: dividend).
DIVISOR_OPS = frozenset({"aten.div", "aten.floor_divide", "aten.remainder", "aten.fmod"})
_EAGER_ERRORS.update({op: (RuntimeError, "ZeroDivisionError") for op in DIVISOR_OPS})
#: one_hot's class values (checked on the eager device, which PyTorch leaves unchecked off
#: the CPU): eager's message depends on the side the value is out on.
_ONE_HOT_ERRORS = (RuntimeError, "Class values must be smaller than num_classes.")
_ONE_HOT_NEGATIVE = "Class values must be non-negative."
_EAGER_ERRORS["aten.one_hot"] = _ONE_HOT_ERRORS
#: Checks of values that are not indices (``lower/index_checks._tied_to_values_check``): the
#: checked tensor holds a code per element, 0 where eager's kernel accepts the data, else a
#: code this table turns into the error eager raises; checked against a range of one, the
#: first nonzero code wins.
_VALUE_ERRORS = {
    # 1: the input, 2: the target, as eager checks them element by element
    "aten.binary_cross_entropy": lambda code: RuntimeError(
        f"all elements of {'input' if code == 1 else 'target'} should be between 0 and 1"),
    "aten.masked_scatter": lambda code: RuntimeError(
        "Number of elements of source < number of ones in mask"),
    # The code holds the range's two ends as float32 bits (high word: the low end).
    # 1: a negative length, 2: lengths not adding up to the axis, 3: a negative segment
    "aten.segment_reduce": lambda code: RuntimeError(
        "lengths contains negative value!" if code == 1 else
        "segment_reduce(): Expected all rows of lengths along axis to sum to "
        "data.size(lengths.dim()-1) when !unsafe." if code == 2 else
        "Expected segment_length >= 0 to be true, but got false.  (Could this error message "
        "be improved?  If so, please report an enhancement request to PyTorch.)"),
    "aten.histc": lambda code: RuntimeError(
        f"torch.histc: range of [{_float32_of(code >> 32):g}, {_float32_of(code):g}] is not "
        "finite"),
    "aten.histogram": lambda code: RuntimeError(
        f"torch.histogramdd: dimension 0's range [{_float32_of(code >> 32):g}, "
        f"{_float32_of(code):g}] is not finite"),
    "aten.histogram.backwards": lambda code: RuntimeError(
        f"torch.histogramdd: min should not exceed max, but got min "
        f"{_float32_of(code >> 32):g} max {_float32_of(code):g} for dimension 0"),
}
#: A ``torch._assert_async`` a decomposition left in a padded graph (``buckets/rules.py``):
#: its message follows the colon, raised as RuntimeError (aot_eager's error).
ASSERT_OP = "aten._assert_async"
#: gather, scatter, scatter_add, scatter_reduce, index_add of a matrix or more.
_GATHER_ERROR = (RuntimeError, "index {value} is out of bounds for dimension {dim} with size "
                               "{size}")

#: How many device-side checks may wait before they are read anyway (a program that never
#: synchronizes must not keep every check output alive).
MAX_PENDING = 1024


def eager_error(op: str, value: int, dim: int, size: int) -> BaseException:
    """The exception eager PyTorch raises for index ``value`` out of range in ``op``.

    Example::

        eager_error("aten.gather", 5, 0, 4)
        # RuntimeError('index 5 is out of bounds for dimension 0 with size 4')
    """
    op, _, detail = op.partition(":")
    if op == ASSERT_OP:
        return RuntimeError(detail)
    if op in _VALUE_ERRORS:
        return _VALUE_ERRORS[op](value)
    kind, template = _eager_kind(op)
    if op == "aten.one_hot" and value < 0:
        template = _ONE_HOT_NEGATIVE
    return kind(template.format(value=value, dim=dim, size=size, length=size - 1,
                                detail=detail))


def _float32_of(bits: int) -> float:
    import struct
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def _eager_kind(op: str) -> tuple:
    """(exception class, message template) eager raises for ``op``; a name may carry details
    after a colon (``aten.max_unpool:4x4``)."""
    return _EAGER_ERRORS.get(op.partition(":")[0], _GATHER_ERROR)


def _error(spec: dict, value: int, where: str | None, deferred: bool) -> BaseException:
    exc = eager_error(spec["op"], value, spec["dim"], spec["size"])
    what = spec["op"]
    division = what in DIVISOR_OPS
    if division:
        what += ": an integer division by a tensor holding zero"
    elif what in _VALUE_ERRORS or what.startswith(ASSERT_OP + ":"):
        what = what.partition(":")[0]  # eager's message says what was wrong
    elif "{value}" not in _eager_kind(what)[1]:  # "out of range in self"
        what += f": index {value} of dim {spec['dim']} of size {spec['size']}"
    where = where or spec.get("where") or "unknown source line"
    note = f" ({what}, at {where})"
    if deferred:
        held = "quotients of a division by zero" if division else \
            "computed from the values it refuses" if spec["op"] in _VALUE_ERRORS else \
            "indices clamped, writes dropped"
        note += (f"; found at this synchronization point, after the op ran on the device: "
                 f"tensors computed from it hold XLA's values ({held}). "
                 f"TORCH_TPU_LAUNCH_BLOCKING=1 raises at the op itself")
    exc.args = (str(exc.args[0]) + note,)
    return exc


def _host_values(buffer) -> list:
    """The (k, 2) check output as a list of [flag, value] pairs (waits for the program)."""
    import numpy as np  # a PJRT buffer reads as an array: no runtime import down here
    return np.asarray(buffer).tolist()


def _first_failure(codes: list, specs: list):
    for (bad, value), spec in zip(codes, specs):
        if bad:
            if spec["size"] is None:  # known at run time only: the flag is 1 + the size
                spec = {**spec, "size": bad - 1}
            return spec, value
    return None


def _where(spec: dict, locations) -> str | None:
    # ``locations``: a caller_location() of the op, or, for a fused graph, one per entry.
    if isinstance(locations, dict):
        locations = locations.get(spec.get("entry"))
    return format_location(locations)


def check_now(buffer, specs: list, locations=None) -> None:
    """Raise eager's error for the first failed check of a check output, read now.

    ``locations`` is the call site (a ``caller_location()``) where the specs' own source lines
    are unknown (eager ops), or maps a fused graph's entries to theirs.
    """
    failure = _first_failure(_host_values(buffer), specs)
    if failure is not None:
        spec, value = failure
        raise _error(spec, value, _where(spec, locations), deferred=False)


_pending: list = []     # (buffer, specs, locations), oldest first
_lock = threading.Lock()


def defer(buffer, specs: list, locations=None) -> None:
    """Keep a check output of results that stay on the device, for ``raise_pending``."""
    _pending.append((buffer, specs, locations))
    if len(_pending) > MAX_PENDING:
        raise_pending()


def has_pending() -> bool:
    return bool(_pending)


def raise_pending(at_op: bool = False) -> None:
    """Read every kept check output; raise for the first that failed (then they are cleared).

    Called at the eager device's synchronization points, and with ``at_op`` right after each
    op in debug mode (TORCH_TPU_LAUNCH_BLOCKING=1). Example::

        torch.tpu.synchronize()     # IndexError here if x[i] ran with i out of range
    """
    global _pending
    if not _pending:
        return
    with _lock:
        pending, _pending = _pending, []
    for buffer, specs, locations in pending:
        failure = _first_failure(_host_values(buffer), specs)
        if failure is not None:
            spec, value = failure
            raise _error(spec, value, _where(spec, locations), deferred=not at_op)


_OURS = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
         os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "torchtpu_eager") + os.sep)


#: Frames of code that is not the user's: importlib, FX's generated graph code.
_GENERATED = ("<frozen ", "<eval_with_key")


def caller_location() -> tuple:
    """(file, line) of the innermost frame outside torch and torchtpu: the user's call.

    Cheap (a walk up the frames, no source read): the eager device records it for each op that
    is checked, and ``format_location`` reads the line only when an error is raised.
    """
    frame = sys._getframe(1)
    torch_dir = _torch_dir()
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(_OURS) or name.startswith(torch_dir) or
                name.startswith(_GENERATED)):
            return name, frame.f_lineno
        frame = frame.f_back
    return None


def format_location(location) -> str | None:
    """"file.py:12: code" for a ``caller_location()`` result (None stays None)."""
    if not location:
        return None
    import linecache
    name, line = location
    code = linecache.getline(name, line).strip()
    return f"{name}:{line}: {code}" if code else f"{name}:{line}"


_torch_path = None


def _torch_dir() -> str:
    global _torch_path
    if _torch_path is None:
        import torch
        _torch_path = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    return _torch_path
