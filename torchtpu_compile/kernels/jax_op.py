"""JAX functions (and Pallas kernels) as PyTorch ops that run on every path.

``jax_op(fn)`` registers ``fn`` as the custom op ``torchtpu_jax::<name>``:

- its shapes come from ``jax.eval_shape`` (the fake implementation Dynamo and AOTAutograd use);
- on CPU tensors it runs ``fn`` through jax on the host (a reference for numerics checks);
- in ``torch.compile`` graphs, on the tpu device and in AOT artifacts, the one lowering splices
  ``fn``'s own StableHLO into the program (``lower/jax_calls.py``), so XLA fuses it with the
  ops around it. A Pallas kernel stays the kernel it is: on TPU its Mosaic custom call reaches
  libtpu; with ``interpret=True`` it is plain StableHLO that any PJRT platform runs;
- its gradient is ``jax.vjp`` of ``fn``, itself registered as a ``jax_op``.

Example::

    import jax, torch
    from torchtpu_compile import jax_op

    @jax_op
    def rms_norm(x, w):
        return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w

    y = torch.compile(lambda x, w: rms_norm(x, w) + 1, backend="torchtpu")(x, w)
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import re

import torch

_NAMESPACE = "torchtpu_jax"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BY_NAME: dict[str, JaxOp] = {}

_TORCH_TO_JAX = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32",
    torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
    torch.complex64: "complex64",
}
_JAX_TO_TORCH = {name: dtype for dtype, name in _TORCH_TO_JAX.items()}


def _jax():
    import jax
    return jax


@contextlib.contextmanager
def _exact_dtypes():
    # jax narrows int64/float64 to 32 bits unless x64 is on; a torch int64 input must stay one.
    jax = _jax()
    with jax.enable_x64(True):
        yield


def _aval(shape, dtype: torch.dtype):
    if dtype not in _TORCH_TO_JAX:
        raise TypeError(f"jax_op: inputs of dtype {dtype} are not supported "
                        f"(supported: {', '.join(str(d) for d in _TORCH_TO_JAX)})")
    return _jax().ShapeDtypeStruct(tuple(int(s) for s in shape), _TORCH_TO_JAX[dtype])


def _torch_dtype(jax_dtype) -> torch.dtype:
    name = str(jax_dtype)
    if name not in _JAX_TO_TORCH:
        raise TypeError(f"jax_op: a result of dtype {name} has no torch dtype")
    return _JAX_TO_TORCH[name]


class JaxOp:
    """A JAX function registered as ``torch.ops.torchtpu_jax.<name>`` (see the module doc).

    Calling it with tensors runs the op; ``.op`` is the ``OpOverload`` graphs record.
    """

    def __init__(self, fn, name: str):
        self.fn = fn
        self.name = name
        self._outputs: dict = {}    # input avals -> list of (shape, torch dtype)
        self._single_output = False  # fn returns one array, not a tuple (set by output_specs)
        self._lowered: dict = {}    # (input avals, precision) -> StableHLO text
        self._vjps: dict = {}       # (number of inputs, differentiable positions) -> JaxOp
        self._on_host = None        # fn jitted once, for CPU tensors
        self.op = self._register()

    def __repr__(self) -> str:
        return f"jax_op({self.name})"

    def __call__(self, *tensors):
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"jax_op {self.name}: argument {i} is a {type(t).__name__}; "
                                f"pass tensors only, and bind other values into the function "
                                f"(functools.partial or a closure)")
        if not tensors:
            raise TypeError(f"jax_op {self.name}: needs at least one tensor argument")
        results = self.op(list(tensors))
        # Read after the op ran: its fake or host kernel asked jax for the result structure,
        # so Dynamo, tracing this method, never has to trace into jax itself.
        return results[0] if self._single_output else tuple(results)

    # --- what jax says about the function -------------------------------------------------
    def avals(self, tensors) -> tuple:
        return tuple(_aval(t.shape, t.dtype) for t in tensors)

    def output_specs(self, avals) -> list:
        """``[(shape, torch dtype)]`` of the results for these input avals."""
        if avals not in self._outputs:
            jax = _jax()
            with _exact_dtypes():
                out = jax.eval_shape(self.fn, *avals)
            leaves, tree = jax.tree_util.tree_flatten(out)
            if not leaves or (len(leaves) > 1 and not isinstance(out, (tuple, list))):
                raise TypeError(f"jax_op {self.name}: the function must return an array or a "
                                f"tuple of arrays, not {tree}")
            self._outputs[avals] = [(tuple(l.shape), _torch_dtype(l.dtype)) for l in leaves]
            self._single_output = not isinstance(out, (tuple, list))
        return self._outputs[avals]

    def stablehlo(self, avals, precision: str, platform: str = "cpu") -> str:
        """The function's StableHLO for these input avals, lowered for ``platform`` (a Pallas
        kernel lowers to Mosaic on "tpu"), in MLIR's generic form (which any context with the
        StableHLO dialect parses, whatever its version's pretty syntax)."""
        key = (avals, precision, platform)
        if key not in self._lowered:
            jax = _jax()

            def flat(*xs):
                return tuple(jax.tree_util.tree_leaves(self.fn(*xs)))

            # keep_unused: the splice passes every input, also one the function only reads
            # the shape of (a random draw "like" a tensor).
            with _exact_dtypes(), jax.default_matmul_precision(_JAX_PRECISION[precision]):
                lowered = jax.jit(flat, keep_unused=True).trace(*avals).lower(
                    lowering_platforms=(platform,))
            module = lowered.compiler_ir("stablehlo")
            self._lowered[key] = module.operation.get_asm(print_generic_op_form=True,
                                                          enable_debug_info=False)
        return self._lowered[key]

    def fingerprint(self, avals, precision: str) -> str:
        """What the lowering caches key this op by: the hash of its StableHLO, so an edited
        function never hits an entry written for the old one."""
        return hashlib.sha256(self.stablehlo(avals, precision).encode()).hexdigest()[:16]

    # --- registration ---------------------------------------------------------------------
    def _register(self):
        lib = torch.library.Library(_NAMESPACE, "FRAGMENT")
        _libraries.append(lib)
        lib.define(f"{self.name}(Tensor[] inputs) -> Tensor[]")
        qualname = f"{_NAMESPACE}::{self.name}"
        lib.impl(self.name, self._run_on_host, "CPU")
        torch.library.register_fake(qualname, self._fake, lib=lib)
        torch.library.register_autograd(qualname, self._backward,
                                        setup_context=self._save_for_backward, lib=lib)
        return getattr(getattr(torch.ops, _NAMESPACE), self.name).default

    def _fake(self, inputs):
        specs = self.output_specs(self.avals(inputs))
        return [inputs[0].new_empty(shape, dtype=dtype) for shape, dtype in specs]

    def _run_on_host(self, inputs):
        from ..runtime.transfer import upload
        jax = _jax()
        self.output_specs(self.avals(inputs))
        if self._on_host is None:
            self._on_host = jax.jit(self.fn)
        with _exact_dtypes():
            # In through numpy views (transfer.upload: never DLPack, whose release takes the GIL
            # on a jax worker thread), out through DLPack; the results are cloned because jax
            # may hand an input back as an output, and an op's output must not alias it.
            cpu = jax.devices("cpu")[0]
            args = [upload(t.detach(), cpu) for t in inputs]
            out = jax.tree_util.tree_leaves(self._on_host(*args))
        return [torch.from_dlpack(o).clone() for o in out]

    def _save_for_backward(self, ctx, inputs, output):
        (tensors,) = inputs
        ctx.save_for_backward(*tensors)

    def _backward(self, ctx, grads):
        inputs = ctx.saved_tensors
        outputs = self.output_specs(self.avals(inputs))
        grads = [g if g is not None else torch.zeros(shape, dtype=dtype, device=inputs[0].device)
                 for g, (shape, dtype) in zip(grads, outputs)]
        wrt = [i for i, t in enumerate(inputs) if t.dtype.is_floating_point or t.dtype.is_complex]
        if not wrt:
            return [None] * len(inputs)
        cotangents = self._vjp_op(len(inputs), tuple(wrt))(*inputs, *grads)
        cotangents = cotangents if isinstance(cotangents, tuple) else (cotangents,)
        by_input = dict(zip(wrt, cotangents))
        return [by_input.get(i) for i in range(len(inputs))]

    def _vjp_op(self, n_inputs: int, wrt: tuple) -> JaxOp:
        key = (n_inputs, wrt)
        if key not in self._vjps:
            jax = _jax()
            fn = self.fn

            def vjp(*args):
                primals, cotangents = args[:n_inputs], args[n_inputs:]

                def of_wrt(*diff):
                    full = list(primals)
                    for i, d in zip(wrt, diff):
                        full[i] = d
                    return tuple(jax.tree_util.tree_leaves(fn(*full)))
                _, pullback = jax.vjp(of_wrt, *(primals[i] for i in wrt))
                return tuple(pullback(tuple(cotangents)))
            suffix = "_".join(str(i) for i in wrt)
            self._vjps[key] = jax_op(vjp, name=f"{self.name}_vjp{n_inputs}_{suffix}")
        return self._vjps[key]


#: Functions ``name -> bool`` that register the ``torchtpu_jax`` op ``name`` where they know
#: it (a decomposition's JAX function, registered on first use) and say whether they did.
_RESOLVERS: list = []
_registering: set = set()  # the names jax_op is registering now
_VJP_NAME = re.compile(r"^(?P<base>.+)_vjp(?P<inputs>\d+)_(?P<wrt>\d+(?:_\d+)*)$")


def resolves_names(resolver):
    """Register ``resolver(name) -> bool`` (above): a graph pickled by another process (a disk
    cache entry) names ops this process has not registered yet.

    Example::

        @resolves_names
        def _mine(name):
            return name == "my_kernel" and bool(jax_op(my_kernel))
    """
    _RESOLVERS.append(resolver)
    return resolver


def _register_by_name(name: str) -> bool:
    """Register op ``name`` where a resolver knows it, or where it is the gradient of an op
    registered here (``JaxOp._vjp_op``'s name); whether it is registered now."""
    if name in _BY_NAME:
        return True
    if name in _registering:
        return False
    vjp = _VJP_NAME.match(name)
    if vjp is not None and _register_by_name(vjp["base"]):
        wrt = tuple(int(i) for i in vjp["wrt"].split("_"))
        _BY_NAME[vjp["base"]]._vjp_op(int(vjp["inputs"]), wrt)
        return name in _BY_NAME
    return any(resolve(name) for resolve in _RESOLVERS)


class _Namespace(torch._ops._OpNamespace):
    """``torch.ops.torchtpu_jax``: an op that is not registered yet is registered by name where
    it can be (``_register_by_name``). The eager device's trace cache and aot_autograd's cache
    unpickle graphs naming a decomposition's JAX function (an FFT, complex arithmetic,
    ``view(dtype)`` across widths, a factorization), which a new process has not made yet:
    every such entry failed to load, with a warning in each process."""

    # The ops' own __module__ is their namespace's: FX prints a target as torch.ops.<...>
    # (and GraphPickler looks it up there) only under torch's.
    __module__ = torch._ops._OpNamespace.__module__

    def __getattr__(self, op_name: str):
        try:
            return super().__getattr__(op_name)
        except AttributeError:
            if op_name.startswith("__") or not _register_by_name(op_name):
                raise
        return super().__getattr__(op_name)


getattr(torch.ops, _NAMESPACE).__class__ = _Namespace

_JAX_PRECISION = {"medium": "default", "high": "high", "highest": "highest"}
_libraries: list = []   # registrations live as long as their Library objects


def jax_op(fn=None, *, name: str | None = None):
    """Register a JAX function as a PyTorch op usable in eager, compiled and AOT code.

    ``fn`` takes and returns jax arrays (one or a tuple); non-tensor parameters are bound
    into it beforehand. ``name`` (default ``fn.__name__``) must be unique in the process.

    Example::

        @jax_op
        def gelu_tanh(x):
            return jax.nn.gelu(x, approximate=True)

        gelu_tanh(torch.randn(4))                               # on the host, through jax
        torch.compile(gelu_tanh, backend="torchtpu")(torch.randn(4))   # spliced in the program
    """
    if fn is None:
        return functools.partial(jax_op, name=name)
    name = name or getattr(fn, "__name__", "")
    if not _NAME.match(name or ""):
        raise ValueError(f"jax_op: {name!r} is not a valid op name; pass name=...")
    if name in _BY_NAME:
        if _BY_NAME[name].fn is fn:
            return _BY_NAME[name]
        raise ValueError(f"jax_op: an op named {name!r} is already registered by "
                         f"{_BY_NAME[name].fn!r}; pass a different name=...")
    _registering.add(name)  # torch asks the namespace for it while defining it
    try:
        kernel = JaxOp(fn, name)
    finally:
        _registering.discard(name)
    _BY_NAME[name] = kernel
    return kernel


def graph_fingerprint(gm) -> str:
    """A digest of the JAX functions ``gm`` calls ("" when it calls none), for cache keys: the
    graph names an op, the digest says which function and StableHLO stand behind the name.

    Example::

        key = graph_key(gm) + graph_fingerprint(gm)
    """
    digest = hashlib.sha256()
    found = False
    for node in gm.graph.nodes:
        kernel = kernel_of(node.target) if node.op == "call_function" else None
        if kernel is None:
            continue
        values = [a.meta.get("val", a.meta.get("example_value")) for a in node.args[0]]
        digest.update(f"{kernel.name}:{kernel.fingerprint(kernel.avals(values), 'highest')};"
                      .encode())
        found = True
    return digest.hexdigest() if found else ""


def kernel_of(target) -> JaxOp | None:
    """The ``JaxOp`` behind a graph node's target, or None for any other op."""
    if isinstance(target, torch._ops.OpOverload) and target.namespace == _NAMESPACE:
        return _BY_NAME.get(target._opname)
    return None
