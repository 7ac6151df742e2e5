"""``TpuTensor``: a tensor on device "tpu", a wrapper whose data is a ``Storage`` on the device.

Each tensor is a strided view (size, stride, offset) of a storage, as a CPU or CUDA tensor is a
view of its memory: that is what keeps aliasing right when a write goes through a view. Every
ATen op on it goes through ``__torch_dispatch__`` to ``torchtpu_eager.dispatch``.

Example::

    x = torch.arange(6.0).to("tpu")
    x.view(2, 3)[0].add_(1)       # reaches x
    print(x)                      # tensor([1., 2., 3., 3., 4., 5.], device='tpu:0')
"""
from __future__ import annotations

import torch

try:
    from torchtpu_compile._native import set_storage_identity
except ImportError as err:  # an extension built before native.cpp gained it
    raise ImportError("torchtpu's native extension is older than torchtpu_compile/csrc/native.cpp: "
                      "rebuild it (`make install`)") from err

from threading import get_ident

from .autograd_thread import enter_thread
from .storage import Storage

DEVICE = torch.device("tpu", 0)  # always with an index: the autograd engine asserts on -1


_strides_of: dict = {}


def contiguous_strides(shape: tuple) -> tuple:
    """The strides of a contiguous tensor of ``shape`` (kept per shape).

    Example::

        contiguous_strides((2, 3))      # (3, 1)
    """
    strides = _strides_of.get(shape)
    if strides is None:
        out, running = [], 1
        for n in reversed(shape):
            out.append(running)
            running *= max(n, 1)
        strides = _strides_of[shape] = tuple(reversed(out))
    return strides


_dispatch = None
_thread = None      # the ident of the thread that ran the last op (autograd_thread.py)
_DATA = torch._C.TensorBase.data  # PyTorch's own `.data` (getter and setter)


class TpuTensor(torch.Tensor):
    """A tensor on the tpu device. Made by PyTorch APIs (``.to("tpu")``, factories), not
    directly."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, storage: Storage, size=None, stride=None, offset: int = 0,
                requires_grad: bool | None = None):
        if isinstance(storage, torch.Tensor):
            # A tpu parameter's type is this class (PyTorch keeps a tensor subclass's type and
            # marks it `_is_param`), so code that rebuilds a parameter as `type(p)(data,
            # requires_grad=...)` (accelerate's offload hooks) lands here: answer as
            # nn.Parameter, what type(p) is on CUDA, does for data on any device.
            return torch.nn.Parameter(storage, True if requires_grad is None else requires_grad)
        size = tuple(size)
        contiguous = contiguous_strides(size)
        stride = contiguous if stride is None else tuple(stride)
        t = torch.Tensor._make_wrapper_subclass(
            cls, size, strides=stride, storage_offset=offset, dtype=storage.dtype,
            device=DEVICE, requires_grad=bool(requires_grad))
        t._st = storage
        set_storage_identity(t, id(storage), storage.nbytes)
        t._set_geometry(size, stride, offset, contiguous)
        return t

    def _set_geometry(self, size: tuple, stride: tuple, offset: int,
                      contiguous: tuple | None = None) -> None:
        storage = self._st
        self._shape = size
        if contiguous is None:
            contiguous = contiguous_strides(size)
        self._dense = is_dense(size, stride, offset, storage.numel, contiguous)

    def _restride(self, size, stride, offset: int) -> None:
        """Give this tensor a new view of its storage, in place (``t_``, ``unsqueeze_``)."""
        from torch.utils._mode_utils import no_dispatch
        size, stride = tuple(size), tuple(stride)
        with no_dispatch():  # the wrapper's own sizes, as as_strided_ sets them on any tensor
            torch.ops.aten.as_strided_.default(self, size, stride, offset)
        self._set_geometry(size, stride, offset)

    def _become(self, other: TpuTensor) -> None:
        """Make this tensor view ``other``'s storage as ``other`` does (its size, stride,
        offset and dtype), keeping its identity, autograd state and version counter: ``x.data
        = y``, and an ``out=`` tensor resized to its result."""
        _DATA.__set__(self, other)  # the C++ geometry and dtype (TensorImpl.shallow_copy_from)
        self._st = other._st
        self._set_geometry(other._shape, tuple(other.stride()), other.storage_offset())

    @property
    def data(self):
        return _DATA.__get__(self)

    @data.setter
    def data(self, new) -> None:
        # PyTorch's setter copies only the C++ tensor's metadata: the storage a TpuTensor reads
        # is a Python attribute, so `x.data = y` gave x y's shape over x's old values.
        if type(new) is not TpuTensor:
            _DATA.__set__(self, new)  # PyTorch's own error (a tensor of another device)
            return
        self._become(new)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        global _dispatch, _thread
        if len(types) > 1:
            # Another tensor subclass among the arguments (a jagged nested tensor's view of tpu
            # values, a DTensor): its own __torch_dispatch__ decides, as the protocol has it.
            # Taken here, the op saw a meta "dummy" argument and raised a device mismatch.
            return NotImplemented
        if _thread != get_ident():  # a thread's first op, or a switch between threads
            if _dispatch is None:
                from .dispatch import dispatch as _dispatch
            _thread = enter_thread()
        return _dispatch(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents=None):
        from .transfer import to_cpu
        host = to_cpu(self)
        if host.numel() == 0:
            contents = "[]"
        else:
            contents = torch._tensor_str._tensor_str(host, len("tensor("))
        text = torch._tensor_str._str_intern(self, tensor_contents=contents)
        # A Parameter comes as "Parameter(TpuTensor(...))"; CUDA's prints as eager's does.
        parameter = text.startswith("Parameter(")
        if parameter:
            text = text[len("Parameter("):-1]
        text = "tensor(" + text[len(type(self).__name__) + 1:]
        return "Parameter containing:\n" + text if parameter else text

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        # Compiled graphs see tpu tensors as plain tensors of device "tpu": a tangent that is
        # a TpuTensor already is what the backward graph expects.
        return self

    def __deepcopy__(self, memo):
        # As eager's: the storage is copied once per deepcopy (through the memo), and the
        # copy views it as this tensor views its own, so views of one storage stay views of
        # one, with their strides and offsets (each was cloned alone: writes to a copied base
        # missed its copied views). A storage's copy shares the immutable buffer until either
        # side is written (clone does that). Eager's rules: a Parameter is copied without its
        # gradient and attributes (Parameter.__deepcopy__), a tensor with both
        # (Tensor.__deepcopy__), and a non-leaf not at all.
        import copy as copy_module
        if id(self) in memo:
            return memo[id(self)]
        if not self.is_leaf:
            raise RuntimeError(
                "Only Tensors created explicitly by the user (graph leaves) support the "
                "deepcopy protocol at the moment.  If you were attempting to deepcopy a module, "
                "this may be because of a torch.nn.utils.weight_norm usage, "
                "see https://github.com/pytorch/pytorch/pull/103001")
        storage = memo.get(id(self._st))
        if storage is None:
            with torch.no_grad():
                whole = TpuTensor(self._st, (self._st.numel,), (1,), 0)
                storage = memo[id(self._st)] = whole.clone()._st
            memo.setdefault(id(memo), []).append(self._st)  # its id stays its (copy's rule)
        copy = TpuTensor(storage, tuple(self.shape), tuple(self.stride()),
                         self.storage_offset())
        copy.requires_grad_(self.requires_grad)
        memo[id(self)] = copy
        if getattr(self, "_is_param", False):
            copy._is_param = True
            return copy
        if self.grad is not None:
            copy.grad = copy_module.deepcopy(self.grad, memo)
        for name, value in user_attributes(self).items():
            setattr(copy, name, copy_module.deepcopy(value, memo))
        return copy

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        # PyTorch's engine compares a gradient's device with its tensor's for plain tensors
        # only: a CPU gradient of a tpu tensor was taken, and left x.grad on the CPU (the
        # error came at the optimizer's step). CUDA's error; a 0-d one moves, as on CUDA.
        if isinstance(gradient, torch.Tensor) and gradient.device != self.device and \
                gradient.dim() != 0:
            raise RuntimeError(f"invalid gradient at index 0 - expected device {self.device} "
                               f"but got {gradient.device}")
        return super().backward(gradient, retain_graph, create_graph, inputs)

    def tolist(self):
        from .transfer import to_cpu
        return to_cpu(self).tolist()

    def numpy(self, *, force: bool = False):
        if not force:  # the same error as on CUDA: device memory is not host memory
            raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use "
                            f"Tensor.cpu() to copy the tensor to host memory first.")
        from .transfer import to_cpu
        return to_cpu(self).numpy()

    def __format__(self, format_spec):
        if self.dim() == 0:
            return self.item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def __reduce_ex__(self, protocol):
        # A view of its storage's host copy, shared by the storage's views (serialization.py).
        from .serialization import reduce
        return reduce(self)


#: What a tpu tensor keeps in its ``__dict__`` for itself (the rest is the user's).
_OWN_ATTRIBUTES = frozenset({"_st", "_shape", "_dense", "_is_param"})


def user_attributes(t) -> dict:
    """The Python attributes a user set on tpu tensor ``t`` (``t.note = ...``), which a copy,
    a save and a load keep as eager's do.

    Example::

        t = torch.ones(2, device="tpu"); t.note = "kept"
        user_attributes(t)   # {"note": "kept"}
    """
    return {k: v for k, v in t.__dict__.items() if k not in _OWN_ATTRIBUTES}


def reach(shape, stride) -> int:
    """How many elements from its first a layout spans: one past its farthest element.

    Example::

        reach((2, 3), (1, 2))   # 6: the last element is at 1 + 2 * 2
    """
    return 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride))


def is_dense(size: tuple, stride: tuple, offset: int, numel: int, contiguous=None) -> bool:
    """Whether a view (``size``, ``stride``, ``offset``) of a storage of ``numel`` elements is
    the whole storage, in order (the common case, read directly).

    Example::

        is_dense((2, 3), (3, 1), 0, 6)      # True
    """
    if offset != 0 or _numel(size) != numel:
        return False
    if numel <= 1:
        return True
    contiguous = contiguous or contiguous_strides(size)
    # A size-1 dim's stride moves no memory: ``x.t()`` of a (1, n) tensor is all of it, in order
    return stride == contiguous or all(
        s == c for n, s, c in zip(size, stride, contiguous) if n != 1)


def _numel(shape) -> int:
    numel = 1
    for n in shape:
        numel *= n
    return numel


def dense_tensor(storage: Storage, shape: tuple, strides: tuple) -> TpuTensor:
    """A tpu tensor that is all of ``storage`` (shape ``shape``, its contiguous ``strides``):
    ``TpuTensor(storage, shape)`` with nothing computed again (the eager per-op fast path).

    Example::

        t = dense_tensor(storage, (2, 3), (3, 1))
    """
    t = _make_wrapper(TpuTensor, shape, strides=strides, storage_offset=0, dtype=storage.dtype,
                      device=DEVICE, requires_grad=False)
    t._st = storage
    set_storage_identity(t, id(storage), storage.nbytes)  # untyped_storage().data_ptr() works
    t._shape = shape
    t._dense = True
    return t


_make_wrapper = torch.Tensor._make_wrapper_subclass


def view_tensor(storage: Storage, shape: tuple, strides: tuple, offset: int,
                dense: bool) -> TpuTensor:
    """A tpu tensor viewing ``storage`` with a geometry decided before (``dense``: as
    ``is_dense`` says of it): ``TpuTensor(storage, shape, strides, offset)`` with nothing
    computed again (the eager device's views).

    Example::

        t = view_tensor(storage, (3, 2), (1, 3), 0, False)     # a transpose of a (2, 3)
    """
    t = _make_wrapper(TpuTensor, shape, strides=strides, storage_offset=offset,
                      dtype=storage.dtype, device=DEVICE, requires_grad=False)
    t._st = storage
    set_storage_identity(t, id(storage), storage.nbytes)
    t._shape = shape
    t._dense = dense
    return t


def strided_tensor(value, shape, stride, dtype, requires_grad: bool = False) -> TpuTensor:
    """A tpu tensor of ``shape`` with strides ``stride`` (eager's layout of a factory or a
    copy: ``empty_strided``, ``.to("tpu")`` of ``x.t()`` or of a channels-last tensor), over a
    fresh storage holding ``value`` (buffer, lazy value or None) in the tensor's memory order.

    A dense layout in another order (a permutation) keeps its storage in memory order, so it is
    read with a transpose, as an op's permuted result is (``dispatch._folded``); any other
    layout (gaps, overlap) gets a flat storage of the elements its strides reach.

    Example::

        t = strided_tensor(None, (3, 2), (1, 3), torch.float32)     # a transposed (2, 3)
    """
    shape, stride = tuple(shape), tuple(stride)
    if stride == contiguous_strides(shape):
        return new_tensor(value, shape, dtype, requires_grad)
    order = memory_layout(shape, stride)
    if order is not None:
        storage_shape = tuple([shape[d] for d in order])
    else:
        storage_shape = (reach(shape, stride),)
    return TpuTensor(Storage(value, storage_shape, dtype, _numel(storage_shape)), shape, stride,
                     requires_grad=requires_grad)


def memory_layout(shape: tuple, stride: tuple) -> list | None:
    """The dims of a layout ``shape``/``stride`` from outermost to innermost in memory, all of
    them, where it is dense and non-overlapping (a permutation of a contiguous layout), else
    None. ``output_slots.memory_order``'s decision, and the logically contiguous case too.

    Example::

        memory_layout((3, 2), (1, 3))      # [1, 0]
    """
    from torchtpu_compile.output_slots import memory_order
    meta = torch.empty_strided(shape, stride, device="meta")
    if meta.is_contiguous():
        return list(range(len(shape)))
    return memory_order(meta)


def new_tensor(value, shape, dtype, requires_grad: bool = False) -> TpuTensor:
    """A dense tpu tensor over a fresh storage holding ``value`` (buffer, lazy value or None)."""
    shape = tuple(shape)
    return TpuTensor(Storage(value, shape, dtype, _numel(shape)), shape,
                     requires_grad=requires_grad)
