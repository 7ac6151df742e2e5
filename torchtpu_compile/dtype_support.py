"""Eager CPU's dtype checks, asked of its kernels once per signature.

A meta kernel (what Dynamo's fake tensors and the eager device's meta check run) checks shapes,
not whether eager's CPU kernel has an instance for the dtype. ``torch.bmm`` of bool tensors
raises ``NotImplementedError: "bmm" not implemented for 'Bool'`` in eager PyTorch, but traced it
lowered to XLA's dot, which takes any type, and returned a value; so did ``hardswish`` of uint8,
``adaptive_avg_pool2d`` of int64 and others (docs/coverage.md, unsupported dtypes).

``check(fn, args, kwargs)`` runs ``fn`` on small host tensors of the inputs' dtypes (zeros of
the real shapes when the inputs are small, else of the same rank with every dimension 1) and,
where the CPU kernel refuses the dtype (``_DTYPE_REFUSALS``: eager's words for it), raises
eager's own exception, type and message. Any other outcome of the probe (a value, or an error
the zeros caused: a singular matrix, a shape argument that no longer fits) says nothing about
the dtype and raises nothing. Each signature (the function, its inputs' dtypes and probe
shapes, its other arguments) is probed once per process.

Example::

    check(torch.bmm, (fake_bool_a, fake_bool_b), {})
    # NotImplementedError: "bmm" not implemented for 'Bool'
"""
from __future__ import annotations

import re
import warnings

import torch

#: How eager says a CPU kernel has no instance for a dtype. One pattern per way of saying it.
_DTYPE_REFUSALS = (
    # AT_DISPATCH's: "bmm" not implemented for 'Bool'
    re.compile(r"not implemented for '\w+'"),
    # TensorIterator's, where a composite op writes a float result into an integer tensor
    # (soft_margin_loss of int64): result type Float can't be cast to the desired output type
    re.compile(r"result type \w+ can't be cast to the desired output type \w+"),
    # Kernels that name the kind of dtype they refuse: maximum and fmax ("not implemented for
    # complex tensors"), clamp and so hardtanh ("not supported for complex types"), relu
    # ("Boolean inputs not supported"), argmax ("does not support bool input"), polar
    # ("Expected both inputs to be Half, Float or Double tensors but got BFloat16 ...") and
    # addcdiv of integers ("Integer division with addcdiv is no longer supported").
    # sort, topk and nansum on CPU: "... does not support complex dtypes" ("... inputs").
    re.compile(r"not implemented for complex tensors|not supported for complex types|"
               r"does not support complex (?:dtypes|inputs)"),
    re.compile(r"Boolean inputs not supported|does not support bool input"),
    re.compile(r"Expected both inputs to be [\w ,]+ tensors but got \w+ and \w+"),
    re.compile(r"Integer division with addcdiv is no longer supported"),
)
#: Inputs of at most this many elements in all are probed at their real shapes: exactly
#: eager's call but for the values, and still microseconds.
_SMALL = 4096
#: A probe whose result (on meta tensors) would hold more elements is not run: its size comes
#: from the op's other arguments (``x.new_zeros(cache_shape)``, ``x.repeat(4096, 1)``), and
#: a compile must not allocate a KV cache on the host to learn a dtype.
_LARGEST_RESULT = 1 << 16

_verdicts: dict = {}   # signature -> the exception eager raises, or None

#: Ops whose CPU kernels read their tensors as far as a list of lengths says, unchecked: a
#: probe at shrunken shapes (above _SMALL) read past them, and a CTC loss's backward on the
#: tpu device killed the process (SIGSEGV). Not probed at shrunken shapes. Embedding bags too:
#: with include_last_offset, offsets shrunk to one element (no bag) made CPU's kernel corrupt
#: the heap, and a recommendation model compiled with padding_idx crashed when its index
#: length changed (the recompile's sizes are symbolic, so shrunken).
_TRUST_THEIR_LENGTHS = frozenset({
    torch.ops.aten._ctc_loss.default, torch.ops.aten._ctc_loss.Tensor,
    torch.ops.aten._ctc_loss_backward.default, torch.ops.aten._ctc_loss_backward.Tensor,
    torch.ops.aten.ctc_loss.IntList, torch.ops.aten.ctc_loss.Tensor,
    torch.nn.functional.embedding_bag, torch.embedding_bag,
    torch.ops.aten.embedding_bag.default, torch.ops.aten.embedding_bag.padding_idx,
    torch.ops.aten._embedding_bag.default, torch.ops.aten._embedding_bag_forward_only.default,
    torch.ops.aten._embedding_bag_backward.default,
    torch.ops.aten._embedding_bag_dense_backward.default,
    torch.ops.aten._embedding_bag_per_sample_weights_backward.default})

#: Ops whose CUDA kernels take dtypes the CPU's refuse, called with them by code written for
#: accelerators, and lowered as CUDA computes them: off the CPU they are not refused.
#: transformers' MoE layers count tokens per expert with ``histc`` of int32 on any device
#: but the CPU and MPS ("torch.histc() does not support integer dtypes on CPU"): Mixtral on
#: the tpu device raised CPU's '"histogram_cpu" not implemented for 'Int''.
_ACCELERATOR_DTYPES = frozenset({torch.ops.aten.histc.default, torch.histc, torch.Tensor.histc})


def _off_the_cpu(args, kwargs) -> bool:
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    return any(t.device.type != "cpu" for t in tensors)


class _Unprobeable(Exception):
    """An argument the probe cannot make concrete (a symbolic size)."""


def _probe_shape(shape, small: bool) -> tuple:
    if not all(isinstance(d, int) for d in shape):
        if small:
            raise _Unprobeable("symbolic shape")
        return tuple(1 for _ in shape)  # the rank is what the kernels' dtype checks see
    return tuple(shape) if small else tuple(min(d, 1) for d in shape)


def _signature(value, small: bool):
    """A hashable account of ``value`` as the probe will see it."""
    if isinstance(value, torch.Tensor):
        return ("T", value.dtype, _probe_shape(value.shape, small))
    if isinstance(value, (list, tuple)):
        kind = "list" if isinstance(value, list) else "tuple"  # fx's immutable_list too
        return (kind,) + tuple(_signature(v, small) for v in value)
    if isinstance(value, dict):
        return ("dict",) + tuple((k, _signature(v, small)) for k, v in value.items())
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise _Unprobeable("symbolic value")
    if isinstance(value, torch.device) and value.type != "cpu":
        raise _Unprobeable("a device move")  # the probe's zeros stay on the host
    if isinstance(value, (int, float, bool, complex, str, type(None), torch.dtype,
                          torch.device, torch.layout, torch.memory_format, slice,
                          type(Ellipsis))):
        return value if not isinstance(value, slice) else ("slice", value.start, value.stop,
                                                             value.step)
    raise _Unprobeable(f"argument of type {type(value).__name__}")


def _materialize(signature, device: str = "cpu"):
    """The value a signature stands for: tensors are zeros on the host (empty on ``meta``)."""
    if isinstance(signature, tuple) and signature and signature[0] == "T":
        if device == "meta":
            return torch.empty(signature[2], dtype=signature[1], device="meta")
        return torch.zeros(signature[2], dtype=signature[1])
    if isinstance(signature, tuple) and signature and signature[0] in ("list", "tuple"):
        values = [_materialize(s, device) for s in signature[1:]]
        return values if signature[0] == "list" else tuple(values)
    if isinstance(signature, tuple) and signature and signature[0] == "dict":
        return {k: _materialize(s, device) for k, s in signature[1:]}
    if isinstance(signature, tuple) and signature and signature[0] == "slice":
        return slice(*signature[1:])
    return signature


def _numel(value) -> int:
    if isinstance(value, torch.Tensor):
        n = 1
        for d in value.shape:
            n *= d if isinstance(d, int) else _SMALL + 1
        return n
    if isinstance(value, (list, tuple)):
        return sum(_numel(v) for v in value)
    if isinstance(value, dict):
        return sum(_numel(v) for v in value.values())
    return 0


def _refuses_dtype(error: BaseException) -> bool:
    message = str(error)
    return any(pattern.search(message) for pattern in _DTYPE_REFUSALS)


def _result_too_large(fn, signature) -> bool:
    """Whether ``fn``'s result for the probe's inputs, computed on meta tensors, is larger than
    a probe may make (where the meta call fails, the host call decides: it raises too, or its
    kernel has no meta twin and its result is bounded by its inputs)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    args, kwargs = _materialize(signature[0], "meta"), _materialize(signature[1], "meta")
    with unset_fake_temporarily(), torch.no_grad():
        try:
            result = fn(*args, **kwargs)
        except Exception:  # noqa: BLE001  (see the docstring)
            return False
    return _numel(result) > _LARGEST_RESULT


class _WarningBoundary(torch.autograd.Function):
    """Runs a function behind a C++ entry of PyTorch's that keeps its own warning buffer.

    A kernel's C++ warning goes to the buffer of the Python call that entered C++ last, and
    becomes a Python warning when that call returns. An ATen op called from Python inside a
    dispatch handler keeps none, so its warnings surfaced at the user's op, past any Python
    filter around the probe: a tpu ``var`` of a large tensor warned "degrees of freedom is
    <= 0" (the probe's one element), a wrong-size ``out=`` warned three times. ``apply``
    is such an entry: what ``fn`` warns is a Python warning when it returns.
    """

    @staticmethod
    def forward(ctx, fn, results):
        results.append(fn())

    @staticmethod
    def backward(ctx, *grads):  # pragma: no cover  (never differentiated: no tensor inputs)
        return None, None


def _quietly(fn):
    """``fn()``, with no warning of its own reaching the user: a probe is not the user's op."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if torch._C._are_functorch_transforms_active():
            return fn()  # an autograd.Function there needs a vmap rule; such warnings may show
        results = []
        _WarningBoundary.apply(fn, results)
        return results[0]


def _probe(fn, signature, autocast_dtype=None) -> BaseException | None:
    return _quietly(lambda: _probe_loudly(fn, signature, autocast_dtype))


def _probe_loudly(fn, signature, autocast_dtype) -> BaseException | None:
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from .host_semantics import eager_semantics
    if _result_too_large(fn, signature):
        return None
    args, kwargs = _materialize(signature[0]), _materialize(signature[1])
    # Outside any fake mode (the compile path traces under one), with eager's dispatch keys,
    # and leaving the CPU generator where it was (a probe of dropout draws from it). Under
    # the CPU autocast of the call only: an ATen op runs after autocast has cast its inputs.
    with unset_fake_temporarily(), eager_semantics(), torch.random.fork_rng(devices=[]), \
            torch.no_grad(), torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16,
                                            enabled=autocast_dtype is not None):
        try:
            fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001  (only a refusal of the dtype counts)
            return exc if _refuses_dtype(exc) else None
    return None


def unsupported_dtype_error(fn, args, kwargs, autocast_dtype=None) -> BaseException | None:
    """The exception eager CPU raises because its kernel for ``fn`` has no instance for the
    inputs' dtypes, or None (it has one, or the probe cannot tell). Probed once per signature,
    under CPU autocast to ``autocast_dtype`` where given (a Dynamo graph's call in such a
    region: autocast casts before the kernel sees a dtype).

    Example::

        unsupported_dtype_error(torch.bmm, (bool_a, bool_b), {})
        # NotImplementedError('"bmm" not implemented for \\'Bool\\'')
    """
    if "device" in kwargs:  # a factory: its dtype is the trace's to judge, not a kernel's
        return None
    if isinstance(fn, torch._ops.OpOverload) and fn.namespace not in ("aten", "prims"):
        return None  # a library's op: probing would run its code once more (side effects)
    if fn in _ACCELERATOR_DTYPES and _off_the_cpu(args, kwargs):
        return None
    small = _numel((args, kwargs)) <= _SMALL
    if not small and fn in _TRUST_THEIR_LENGTHS:
        return None
    try:
        signature = (_signature(tuple(args), small), _signature(dict(kwargs), small))
        key = (fn, signature, autocast_dtype)
        hash(key)
    except (_Unprobeable, TypeError):
        return None
    if key not in _verdicts:
        _verdicts[key] = _probe(fn, signature, autocast_dtype)
    return _verdicts[key]


def check(fn, args, kwargs) -> None:
    """Raise eager CPU's exception (its type and message) where its kernel for ``fn`` refuses
    the inputs' dtypes (module doc); args are tensors of any device or mode (fake, meta, tpu).

    Example::

        check(torch.ops.aten.bmm.default, (bool_a, bool_b), {})
        # NotImplementedError: "bmm" not implemented for 'Bool'
    """
    error = unsupported_dtype_error(fn, args, kwargs)
    if error is not None:
        raise _fresh(error)


def _fresh(error: BaseException) -> BaseException:
    """A new exception like ``error`` (raising one object again and again grows its
    traceback)."""
    try:
        return type(error)(*error.args)
    except Exception:  # noqa: BLE001  (a constructor of another shape: the object itself)
        return error


#: Tensor methods a probe must not call: they move their tensor to a device (ours too).
_MOVES = frozenset({"to", "cuda", "cpu", "tpu", "pin_memory", "share_memory_", "type"})


def _graph_fn(node):
    """The callable a Dynamo graph node calls, where a probe may call it on host tensors: a
    torch function or ATen op, an operator (``operator.matmul``) or a Tensor method; None for
    the rest (higher-order ops, collectives, custom ops, grad-mode and autocast switches)."""
    if node.op == "call_method":
        fn = getattr(torch.Tensor, node.target, None) if node.target not in _MOVES else None
        return fn if callable(fn) else None
    if node.op != "call_function":
        return None
    fn = node.target
    if isinstance(fn, torch._ops.HigherOrderOperator):
        return None
    if isinstance(fn, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        # a packet (torch.ops.aten.index_put, as user code calls it) names its namespace in
        # its qualified name only; an overload has ``namespace``
        namespace = fn._qualified_op_name.split("::")[0] if isinstance(
            fn, torch._ops.OpOverloadPacket) else fn.namespace
        return fn if namespace in ("aten", "prims") else None
    module = getattr(fn, "__module__", None) or ""
    if module == "_operator" or (module.startswith("torch") and not module.startswith(
            ("torch.distributed", "torch._dynamo", "torch.amp", "torch.autograd",
             "torch.cuda", "torch.random", "torch._C._distributed"))):
        return fn
    return None


def _example(value):
    """A node's example value (Dynamo's fake tensor), or the value itself."""
    if isinstance(value, torch.fx.Node):
        if "example_value" not in value.meta:
            raise _Unprobeable("no example value")
        return value.meta["example_value"]
    return value


def _has_tensor(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_tensor(v) for v in value)
    if isinstance(value, dict):
        return any(_has_tensor(v) for v in value.values())
    return False


def graph_error(gm: torch.fx.GraphModule) -> BaseException | None:
    """The first error eager CPU raises for a dtype its kernels refuse, in a Dynamo graph's
    calls, judged on the nodes' example values (one pass, probes once per signature); None
    where every call's kernels take their dtypes.

    Example::

        graph_error(dynamo_graph_of(lambda a, b: a @ b, bool_a, bool_b))
        # NotImplementedError('"bmm" not implemented for \'Bool\'')
    """
    from torch.fx.node import map_aggregate
    autocast = _AutocastRegions()
    for node in gm.graph.nodes:
        if autocast.follow(node):
            continue
        fn = _graph_fn(node)
        if fn is None:
            continue
        try:
            args, kwargs = map_aggregate((node.args, node.kwargs), _example)
        except _Unprobeable:
            continue
        if not _has_tensor((args, kwargs)):
            continue  # no tensor: no kernel dtype to ask about
        devices = {t.device.type for t in (*args, *kwargs.values())
                   if isinstance(t, torch.Tensor)}
        if any(autocast.dtype(d) is not None for d in devices - {"cpu"}):
            # an accelerator's autocast (tpu's follows CUDA's op lists) casts before its
            # kernel: no CPU probe can play it
            continue
        error = unsupported_dtype_error(fn, args, kwargs,
                                        autocast.dtype("cpu") if "cpu" in devices else None)
        if error is not None:
            return _fresh(error)
    return None


class _AutocastRegions:
    """The autocast state at each node of a Dynamo graph: the caller's (Dynamo guards on
    it), then the regions the graph enters and leaves (``_enter_autocast`` nodes)."""

    def __init__(self):
        self._stack = [{}]
        for device in ("cpu", "tpu"):
            if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
                self._stack[0][device] = torch.get_autocast_dtype(device)

    def follow(self, node) -> bool:
        """Whether ``node`` enters or leaves a region (and take the step)."""
        if node.op != "call_function":
            return False
        if node.target is torch.amp.autocast_mode._enter_autocast:
            device, dtype, enabled = (list(node.args) + [None, None, True])[:3]
            state = dict(self._stack[-1])
            if enabled:
                state[device] = dtype or torch.get_autocast_dtype(device)
            else:
                state.pop(device, None)
            self._stack.append(state)
            return True
        if node.target is torch.amp.autocast_mode._exit_autocast:
            if len(self._stack) > 1:
                self._stack.pop()
            return True
        return False

    def dtype(self, device: str):
        """The autocast dtype for ``device`` at the current node, or None where it is off."""
        return self._stack[-1].get(device)
