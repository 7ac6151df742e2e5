"""Reading and writing a tensor's values through its view of a storage.

A dense tensor (its whole storage, in order) is its storage's buffer. Any other view is read
with a graph of its own (a transpose where it permutes the whole storage, else a gather) and
written likewise (a transpose, else a scatter), keyed by the view's geometry and compiled
once, so a write through ``x[0]``, ``x.t()`` or ``x.view(16)`` reaches every alias. An op
runs its inputs' read graphs inside its own program (``read_graph_of``, ``dispatch.py``).

A gather or scatter takes the view's storage offset as an input (a position:
``scalars.as_input``), not as a constant: ``x[t]`` over time steps, ``x[i:i + bs]`` over
batches and ``y[i] = v`` compiled a program per position (forward_forward: 150 of its 248).

Example::

    value = read(t)          # a buffer (or lazy value) with t's shape
    write(t, new_value)      # t and every view of its storage now see new_value
"""
from __future__ import annotations

import functools
import gc
import sys
import weakref

import torch

from torchtpu_compile.lower.index_checks import unchecked
from torchtpu_compile.runtime.cache import RecentlyUsed

from . import modes, scalars
from .programs import example, trace
from .storage import Storage
from .tensor import contiguous_strides, is_dense, memory_layout, view_tensor

_graphs = RecentlyUsed()   # a view's read or write -> its OpGraph (a program, once run)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


#: Dtypes whose zeros and strided reads torch-mlir cannot build in a program (a literal of
#: ui32 fails to legalize; ui16, ui64 and complex128 lower nothing): made on the host instead
#: (zeros once per never-written storage; ops on them run on the host anyway, counted).
#: ``torch.where(c, float64_x, 2j)`` raised LoweringError for the number's complex128 tensor.
_HOST_ONLY = frozenset({torch.uint16, torch.uint32, torch.uint64, torch.complex128})


def _zeros_graph(shape: tuple, dtype):
    key = ("zeros", shape, dtype)
    graph = _graphs.get(key)
    if graph is None:
        graph = _graphs[key] = trace(lambda: (torch.zeros(shape, dtype=dtype),), [],
                                     f"zeros{list(shape)}", what=key)
    return graph


def _permuted_dims(base_shape: tuple, size: tuple, stride: tuple, offset: int):
    """The dims of a view that walk all of its base once, outermost first, where the view is
    a transpose or permutation of the whole base, maybe broadcast along more dims (stride 0):
    ``w.t()`` (``F.linear``'s weight), ``x.transpose(1, 2)``, ``x.expand(...)``. None for any
    other view (an offset, a slice, steps, overlap)."""
    if offset != 0:
        return None
    walked = sorted((d for d in range(len(size)) if size[d] != 1 and stride[d] != 0),
                    key=lambda d: -stride[d])
    expected = 1
    for d in reversed(walked):
        if stride[d] != expected:
            return None
        expected *= size[d]
    return walked if expected == _numel(base_shape) else None


@functools.lru_cache(maxsize=4096)  # asked on every strided read and write
def _positioned(base_shape: tuple, size: tuple, stride: tuple, offset: int,
                write: bool = False) -> bool:
    """Whether the view is read (``write``: written) with a gather (scatter) at its offset,
    taken as an input (module doc): any view but a transpose or permutation of its whole base
    (for a read, maybe broadcast too)."""
    if _permuted_dims(base_shape, size, stride, offset) is None:
        return True
    return write and not all(stride[d] or size[d] == 1 for d in range(len(size)))


def _positions(t, write: bool = False) -> list:
    """The inputs a read (``write``: write) of view ``t`` takes after its values: its offset,
    or none."""
    offset = t.storage_offset()
    if _positioned(t._st.shape, t._shape, tuple(t.stride()), offset, write):
        return [scalars.as_input([offset], torch.int64)]
    return []


def _read_graph(base_shape: tuple, dtype, size: tuple, stride: tuple, offset: int):
    positioned = _positioned(base_shape, size, stride, offset)
    key = ("read", base_shape, dtype, size, stride, None if positioned else offset)
    graph = _graphs.get(key)
    if graph is None:
        walked = None if positioned else _permuted_dims(base_shape, size, stride, offset)
        examples = [example(base_shape, dtype)]
        if walked is not None:
            # A transpose and a broadcast, which XLA does in place of a gather's index math
            # (a gather of F.linear's w.t() cost more than the matmul).
            kept = sorted(walked)
            order = [walked.index(d) for d in kept]
            shape = [size[d] if d in walked else 1 for d in range(len(size))]

            def fn(base):
                value = base.reshape([size[d] for d in walked]).permute(order)
                return (value.reshape(shape).expand(size).clone(),)
        else:
            # A gather at the view's flat positions: torch-mlir's as_strided lowering crashes
            # on zero strides (expanded views).
            def fn(base, position):
                index = _flat_indices(size, stride, scalars.read_input(position, 0))
                return (base.reshape(-1)[index].reshape(size),)
            examples.append(example((1,), torch.int64))
        with unchecked():  # positions in range by construction: no index checks
            graph = _graphs[key] = trace(fn, examples, f"read{list(size)}", what=key)
    return graph


def _flat_indices(size: tuple, stride: tuple, offset) -> torch.Tensor:
    """The storage positions of a view's elements; ``offset`` an int or a 0-dim int64 tensor."""
    index = offset if isinstance(offset, torch.Tensor) else \
        torch.full((), offset, dtype=torch.int64)
    for dim, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[dim] = n
        index = index + (torch.arange(n, dtype=torch.int64) * s).reshape(shape)
    return index.reshape(-1)


def _overlaps(size: tuple, stride: tuple, offset: int) -> bool:
    """Whether two elements of the view share a location of its storage."""
    index = _flat_indices(size, stride, offset)
    return index.unique().numel() < index.numel()


def _write_graph(base_shape: tuple, dtype, size: tuple, stride: tuple, offset: int):
    positioned = _positioned(base_shape, size, stride, offset, write=True)
    key = ("write", base_shape, dtype, size, stride, None if positioned else offset)
    graph = _graphs.get(key)
    if graph is None:
        walked = None if positioned else _permuted_dims(base_shape, size, stride, offset)
        examples = [example(base_shape, dtype), example(size, dtype)]
        if not positioned:
            dims = sorted(walked)
            order = [dims.index(d) for d in walked]

            def fn(base, value):  # the inverse transpose: it writes every element of the base
                kept = value.reshape([size[d] for d in dims])
                return (kept.permute(order).reshape(base_shape),)
        elif not _overlaps(size, stride, 0):
            def fn(base, value, position):
                flat = base.reshape(-1)
                # A scatter at the view's flat positions (as_strided_scatter does not lower).
                index = _flat_indices(size, stride, scalars.read_input(position, 0))
                return (flat.index_put((index,), value.reshape(-1)).reshape(base_shape),)
        else:
            def fn(base, value, position):
                # Elements that share a location (an expanded view): eager writes them in turn,
                # and the ops it lets write there (fill_, masked_fill_, index_fill_, x[i] = v)
                # skip the elements they do not change, so the last element that changed
                # wins; a scatter of duplicate positions picks any (masked_fill_ kept a copy
                # the mask skipped: fuzz seed 1318).
                flat = base.reshape(-1)
                index = _flat_indices(size, stride, scalars.read_input(position, 0))
                new = value.reshape(-1)
                order = torch.arange(new.numel(), dtype=torch.int64)
                changed = torch.where(new != flat[index], order, -1)
                last = torch.full(flat.shape, -1, dtype=torch.int64).scatter_reduce(
                    0, index, changed, "amax")
                written = torch.where(last >= 0, new[last.clamp(min=0)], flat)
                return (written.reshape(base_shape),)
        if positioned:
            examples.append(example((1,), torch.int64))
        with unchecked():
            graph = _graphs[key] = trace(fn, examples, f"write{list(size)}", what=key)
    return graph


def storage_value(storage):
    """The storage's buffer (or lazy value); storage never written reads as zeros."""
    value = storage.value
    if value is None:
        if storage.freed:
            raise RuntimeError(
                f"tpu: reading a tensor whose storage was freed (untyped_storage().resize_(0)): "
                f"{str(storage.dtype)[6:]}[{storage.numel}]; re-allocate it and write it first")
        if storage.dtype is torch.complex32:  # made by an op (where(m, 2j, half)), not moved
            from torchtpu_compile.runtime.transfer import no_element_type
            raise TypeError(no_element_type(storage.dtype))
        mode = modes.current()
        if storage.dtype in _HOST_ONLY:
            from .transfer import upload
            value = upload(torch.zeros(storage.shape, dtype=storage.dtype))
        else:
            # No cut: a caller may hold a value it read (copy_'s source) for the write to come.
            [value] = mode.apply(_zeros_graph(storage.shape, storage.dtype), [], cut=False)
        storage.value = value
        # Deferred, the zeros are a value of the recording: noted, so that its run keeps them
        # for the storage (unnoted, a later read of it found them dropped).
        mode.note_write(storage)
    return value


def read(t):
    """The value of tpu tensor ``t``: its storage's buffer when dense, else a gathered copy."""
    storage = t._st
    if _numel(t._shape) == 0 or storage.numel == 0:
        # Nothing to gather (and torch-mlir rejects zero-size slices): an empty buffer.
        from .transfer import upload
        return upload(torch.empty(t._shape, dtype=storage.dtype))
    value = storage_value(storage)
    if t._dense and t._shape == storage.shape:
        return value
    if storage.dtype in _HOST_ONLY:
        from .transfer import download, upload
        whole = download(modes.concrete(value)).reshape(-1)
        return upload(whole.as_strided(t._shape, t.stride(), t.storage_offset()).contiguous())
    graph = _read_graph(storage.shape, storage.dtype, t._shape, tuple(t.stride()),
                        t.storage_offset())
    mode = modes.current()
    positions = _positions(t)
    if mode.reads_apart and _apart(t, value):
        return graph.run([modes.concrete(value), *positions])[0]
    # No cut here: the op that reads ``t`` may read other views next, and a cut there would
    # drop this value, held by no storage (fuse.DeferAndFuse.apply).
    [result] = mode.apply(graph, [value, *positions], cut=False)
    if t._dense:
        # The whole storage in order under another shape (``x.view(1, 1)``): the same values,
        # so the storage keeps them in this shape, as a dense write does. Ops then take ``t``
        # as is: read once (``.item()``), a view no longer differs from a fresh tensor in the
        # programs of the ops that read it (DQN's cat of 32 actions, each a view of argmax or
        # a fresh tensor at random, folded a reshape per view: a program per step).
        storage.value = result
        storage.shape = t._shape
        mode.note_write(storage)
    return result


def _apart(t, value) -> bool:
    """Whether the read of view ``t`` of ``value`` runs as a program of its own, where the
    mode's ``reads_apart`` (asked by the caller) allows it: a part of a computed buffer
    (``target[i]`` of a batch), so that the recording that uses it takes the part, not the
    whole buffer, and its program does not depend on the buffer's size (seq2seq's per-token
    steps compiled again for each sentence length). Only a view laid out as a fresh tensor
    would be: an op's result follows its inputs' strides (``dispatch._eager_layout`` reads
    them off the folded view)."""
    if modes.pending(value):
        return False
    stride = tuple(t.stride())
    return stride == contiguous_strides(t._shape) and \
        _positioned(t._st.shape, t._shape, stride, t.storage_offset())


def storage_order(t) -> list | None:
    """The dims of tpu tensor ``t`` from outermost to innermost in memory where ``t`` is all of
    its storage with other strides than a contiguous tensor's (``x.t()`` of a fresh ``x``, a
    channels-last tensor), else None: such a tensor moves to and from the host as its
    storage, in memory order, with no transpose on the device (``transfer.py``).

    Example::

        storage_order(torch.zeros(2, 3, device="tpu").t())      # [1, 0]
    """
    stride = tuple(t.stride())
    if stride == contiguous_strides(t._shape) or t.storage_offset() != 0 or \
            _numel(t._shape) != t._st.numel or t._st.numel < 2:
        return None
    return memory_layout(t._shape, stride)


def read_graph_of(t):
    """(the graph ``read(t)`` runs on ``t``'s storage value, the inputs it takes after that
    value), or None where it runs none (a dense tensor, an empty one): what an op folds into
    its own program (``dispatch.py``).

    Example::

        read_graph_of(w.t())      # (the transpose of w's storage, [])
        read_graph_of(x[3])       # (a gather of x's storage, [the offset of x[3]])
    """
    storage = t._st
    if (t._dense and t._shape == storage.shape) or _numel(t._shape) == 0 or \
            storage.numel == 0:
        return None
    # The mode's attribute first: strict mode makes no call more per strided input.
    if (modes._current or modes.current()).reads_apart and _apart(t, storage.value):
        return None  # read() runs it apart
    return (_read_graph(storage.shape, storage.dtype, t._shape, tuple(t.stride()),
                        t.storage_offset()), _positions(t))


def check_writable(storage) -> None:
    """Raise where ``storage`` holds a view op's computed result (``Storage.stands_for``).

    The device computes the views a strided view of one typed buffer cannot be (``view(dtype)``,
    ``conj()``, ``_neg_view``, ``real``/``imag`` of complex): eager writes through them to
    their base, here the write was kept in the copy and the base silently kept its values."""
    raise RuntimeError(
        f"tpu: writing into the result of {storage.stands_for}, which the tpu device computes "
        f"as a new tensor rather than a view (a device buffer has one dtype and no conjugate "
        f"or negative bit): eager would write through it to its base, which would not change "
        f"here. Write the base instead, or clone() the view before writing to it.")


def write(t, value, _written_back_from=None) -> None:
    """Make ``value`` (with ``t``'s shape and dtype) the contents of ``t``, through its view."""
    storage = t._st
    linked = storage.stands_for
    if type(linked) is str:
        check_writable(storage)
    if storage.freed:
        raise RuntimeError(f"tpu: writing into a tensor of shape {list(t._shape)} whose storage "
                           f"was freed (untyped_storage().resize_(0)); re-allocate it first")
    if t._dense:
        storage.value = value
        storage.shape = t._shape
    elif storage.dtype in _HOST_ONLY:  # as read(): no device program for these dtypes
        from .transfer import download, upload
        whole = download(modes.concrete(storage_value(storage))).reshape(-1)
        whole.as_strided(t._shape, t.stride(), t.storage_offset()).copy_(
            download(modes.concrete(value)).reshape(t._shape))
        storage.value = upload(whole.reshape(storage.shape))
    else:
        base = storage_value(storage)
        graph = _write_graph(storage.shape, storage.dtype, t._shape, tuple(t.stride()),
                             t.storage_offset())
        storage.value = modes.current().apply(
            graph, [base, value, *_positions(t, write=True)])[0]
    modes.current().note_write(storage)
    if linked is not None:
        linked.written(storage, _written_back_from)


#: View ops whose result a storage of one dtype cannot view (a complex buffer seen as its
#: float pairs, and back; any buffer's bits seen as another dtype), each with the op that
#: undoes it. The device computes the result; a ``Reinterpreted`` link then carries writes
#: both ways, as eager's aliasing does.
_REINTERPRETING = {
    torch.ops.aten.view_as_real.default: torch.ops.aten.view_as_complex.default,
    torch.ops.aten.view_as_complex.default: torch.ops.aten.view_as_real.default,
    torch.ops.aten.view.dtype: torch.ops.aten.view.dtype,
}


def computed_view(func, base, out, arguments: tuple = ()) -> None:
    """Note that ``out`` is view op ``func``'s result on ``base`` (called with ``base`` and
    ``arguments``), computed, not viewed.

    Writes through ``view_as_real`` / ``view_as_complex`` / ``view(dtype)`` results reach
    their base, and the base's writes reach them: torch's Adam and AdamW update a complex
    parameter through ``torch.view_as_real(p)`` in place, which raised here, and a
    ``view(torch.int32)`` kept its first values after its base was written. Other computed
    views (``conj()``, ``_neg_view``) stay refused (``check_writable``)."""
    inverse = _REINTERPRETING.get(func)
    source = base._st.stands_for
    if inverse is None or type(source) is str:  # a view of a refused view is refused too
        out._st.stands_for = str(func)
        return
    from .tensor import view_tensor
    if source is None:
        source = base._st.stands_for = Reinterpreted()
    # The base as it views its storage now: an in-place view op on it later (t_) leaves the
    # computed view's meaning as it was, as in eager.
    base = view_tensor(base._st, base._shape, tuple(base.stride()), base.storage_offset(),
                       base._dense)
    # (view(dtype)'s inverse views the bits as the base's dtype again)
    inverse_arguments = (base.dtype,) if arguments else ()
    out._st.stands_for = Reinterpreted(base, (func, *arguments), (inverse, *inverse_arguments), (
        out._shape, tuple(out.stride()), out.storage_offset(), out._dense))
    # Dead ones dropped here too: a base read through a new view each step, and never
    # written, would otherwise keep a reference per step.
    source.derived = [ref for ref in source.derived if ref() is not None]
    source.derived.append(weakref.ref(out._st))


class Reinterpreted:
    """A storage's link (``Storage.stands_for``) to the storages computed from it by a
    ``_REINTERPRETING`` view, and, for such a storage, to the tensor it was computed from.

    A write to a computed storage is written back into its base through the inverse op; a
    write to a base recomputes every storage computed from it. Eager's views share memory;
    a device buffer has one dtype, so the two storages are kept equal instead."""

    __slots__ = ("base", "func", "inverse", "geometry", "derived")

    def __init__(self, base=None, func=(), inverse=(), geometry=None):
        self.base = base            # the tensor this storage was computed from (or None)
        # (op, its arguments after the tensor), computing this storage and undoing it
        self.func, self.inverse = func, inverse
        self.geometry = geometry    # the computed tensor's (size, stride, offset, dense)
        self.derived: list = []     # weak references to storages computed from this one

    def written(self, storage, written_back_from) -> None:
        from .dispatch import run_op
        from .tensor import view_tensor
        if self.base is not None:  # (a write from its own base never comes here)
            view = view_tensor(storage, *self.geometry)
            inverse, *arguments = self.inverse
            write(self.base, read(run_op(inverse, (view, *arguments), {})), storage)
        self._recompute_derived(skip=written_back_from)

    def _recompute_derived(self, skip) -> None:
        from .dispatch import run_op
        live = []
        for ref in self.derived:
            derived = ref()
            if derived is None:
                continue
            live.append(ref)
            if derived is skip:  # the write came from it: it holds the values already
                continue
            link = derived.stands_for
            func, *arguments = link.func
            fresh = run_op(func, (link.base, *arguments), {})._st
            derived.value, derived.shape = fresh.value, fresh.shape
            modes.current().note_write(derived)
            link._recompute_derived(skip=None)
        self.derived = live


def _other_tensors_over(storage, t) -> list:
    """The live tpu tensors other than ``t`` whose storage is ``storage``. A tensor holds its
    storage in its ``__dict__``: the references beyond ``t``'s and the caller's two (its
    variable, getrefcount's argument) are looked through only where there are some."""
    if sys.getrefcount(storage) <= 4:  # t's dict, the caller's and this frame's names, argument
        return []
    found = []
    for holder in gc.get_referrers(storage):
        if type(holder) is dict and holder.get("_st") is storage:
            found += [o for o in gc.get_referrers(holder)
                      if type(o) is type(t) and o is not t and o.__dict__ is holder]
    return found


def resize(t, shape, keep: bool = True) -> None:
    """Give ``t`` the contiguous ``shape`` at its storage offset, as eager's ``resize_``:
    over its own storage where that holds it (its values stay), else over a larger one
    (``keep``: holding its storage's values first, as eager's grown storage does).

    Eager grows a storage in place, under every view of it. A device buffer cannot grow (its
    views' geometry is decided against its size): a tensor that is its whole storage
    (``torch.empty(0)``, the usual out=) gets a new one, and so do the other tensors over the
    old one (its views, a ``set_`` alias), at the same geometry; a view of a larger storage
    raises rather than leave its base without the values."""
    shape = tuple(shape)
    offset, numel, storage = t.storage_offset(), _numel(shape), t._st
    if offset + numel > storage.numel:
        if not t._dense:
            raise RuntimeError(
                f"tpu: resizing a view (shape {list(t.shape)}, storage offset {offset}) of a "
                f"storage of {storage.numel} elements to {list(shape)} would grow the storage "
                f"under its other views, which the device cannot do. Resize a tensor that is "
                f"its whole storage, or pass an out= of shape {list(shape)}.")
        aliases = _other_tensors_over(storage, t)
        old, storage = storage, Storage(None, (numel,), storage.dtype, numel)
        if (keep or aliases) and old.numel:
            flat = (old.numel,)
            write(view_tensor(storage, flat, (1,), 0, False),
                  read(view_tensor(old, flat, (1,), 0, True)))
        for alias in aliases:
            size, stride, at = alias._shape, tuple(alias.stride()), alias.storage_offset()
            alias._become(view_tensor(storage, size, stride, at,
                                      is_dense(size, stride, at, storage.numel)))
    strides = contiguous_strides(shape)
    t._become(view_tensor(storage, shape, strides, offset,
                          is_dense(shape, strides, offset, storage.numel)))
