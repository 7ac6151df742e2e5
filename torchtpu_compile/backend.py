"""The TorchDynamo backend "torchtpu".

Registered through the ``torch_dynamo_backends`` entry point, so in a fresh interpreter::

    model = torch.compile(model, backend="torchtpu")

aot_autograd functionalizes the Dynamo graph, applies core-ATen decompositions and, for
training, splits forward and backward; each resulting graph becomes a ``GraphRunner``.
"""
from __future__ import annotations

import contextlib

import itertools
import sys

import torch

from . import errors

_backend_ids = itertools.count()

# Dynamo resolves backend="torchtpu" (importing this module) before it traces, which is when it
# must know that tensors of the eager tpu device are tensors.
if "torchtpu_eager" in sys.modules:
    import torchtpu_eager.compile_support
    torchtpu_eager.compile_support.teach_dynamo()


def _forward_metadata(kind: str):
    """aot_autograd's metadata (``ViewAndMutationMeta``) of the forward graph being compiled;
    None for a backward graph (it describes the forward's inputs and outputs, not these) or
    outside a trace."""
    if kind == "backward":
        return None
    context = torch._guards.TracingContext.try_get()
    return getattr(context, "fw_metadata", None)


def _keep_saved_tensors(kind: str) -> None:
    """Tell aot_autograd that our backward graphs overwrite none of the tensors saved for
    them (its "donated buffers", an Inductor memory saving we do not use; our programs donate
    on their own terms, program/donation.py). With the list non-empty, aot_autograd refuses
    ``backward(retain_graph=True)`` through any backward compiled with the forward, as the
    graph cache has every backward compiled: a second backward through a retained graph, or a
    GAN's, raised where eager returns."""
    metadata = _forward_metadata(kind)
    if metadata is not None and getattr(metadata, "bw_donated_idxs", None):
        metadata.bw_donated_idxs = []


def _static_inputs(kind: str, inputs: int | None = None) -> frozenset:
    """Forward inputs that stay resident on the device: parameters and buffers, and inputs the
    graph writes in place (a static KV cache and its length, made by an earlier graph: state
    that the next call passes again). Resident is safe for any host tensor (transfer.py keeps
    only a buffer that is the tensor's memory); it saves the upload at every call.
    ``inputs``: the graph's input count, for the in-place ones (the metadata's must match)."""
    metadata = _forward_metadata(kind)
    static = frozenset(getattr(metadata, "static_input_indices", None) or ())
    info = getattr(metadata, "input_info", None)
    if info is not None and len(info) == inputs:
        static |= {i for i, each in enumerate(info)
                   if each.mutates_data and not each.mutates_metadata}
    return static


def _mutated_inputs(kind: str, gm: torch.fx.GraphModule) -> tuple:
    """(graph input, graph output) for each input the graph overwrites: aot_autograd returns
    its new value first among the outputs and copies it into the input after the call (the
    inputs a program may donate: ``program/donation.py``). Empty where the metadata does not
    describe this graph's inputs one to one."""
    metadata = _forward_metadata(kind)
    indices = getattr(metadata, "mutated_inp_runtime_indices", None)
    if not indices or getattr(metadata, "tokens", None):
        return ()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    info = metadata.input_info
    if len(placeholders) < len(info):
        return ()
    # Data mutations only: a metadata mutation (set_, resize_) is replayed otherwise.
    return tuple((i, k) for k, i in enumerate(indices)
                 if info[i].mutates_data and not info[i].mutates_metadata
                 and not info[i].mutates_storage_metadata)


def _user_outputs(kind: str, gm: torch.fx.GraphModule) -> tuple:
    """Positions of the graph's outputs that the user's code gets: after the new values of
    mutated inputs, before aot_autograd's own (intermediate bases, what the backward saves).
    They come back with eager's strides, as Inductor's do (its ``keep_output_stride``); the
    others keep the layout the program computes them in. Empty for backward graphs
    (autograd lays gradients out as their parameters) or unknown metadata."""
    metadata = _forward_metadata(kind)
    info = getattr(metadata, "output_info", None)
    if info is None or getattr(metadata, "tokens", None):
        return ()
    start = len(metadata.mutated_inp_runtime_indices)
    outputs = gm.graph.output_node().args[0]
    if not isinstance(outputs, (tuple, list)) or start + len(info) > len(outputs):
        return ()
    return tuple(range(start, start + len(info)))


def _compiler(kind: str, graph_id: int, cached: bool):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        _keep_saved_tensors(kind)
        inputs = sum(1 for node in gm.graph.nodes if node.op == "placeholder")
        name, resident = f"graph_{graph_id}/{kind}", _static_inputs(kind, inputs)
        mutated, layouts = _mutated_inputs(kind, gm), _user_outputs(kind, gm)
        if cached:  # a picklable wrapper; backward graphs are built on their first call
            from .graph_cache import RunnerOutputCode
            return RunnerOutputCode(gm=gm, name=name, resident_inputs=resident,
                                    lazy=kind == "backward", mutated_inputs=mutated,
                                    eager_layouts=layouts, inputs_die=kind == "backward")
        from .program import GraphRunner
        return GraphRunner(gm, name=name, resident_inputs=resident, mutated_inputs=mutated,
                           eager_layouts=layouts, inputs_die=kind == "backward")

    if cached:
        from .graph_cache import serializable
        return serializable(compile_graph)
    return compile_graph


def _decompositions() -> dict:
    # A module-level hook, as _compiler: numerics.locate captures with ours left whole.
    from .lower.decompositions import decomposition_table
    return decomposition_table()


def _check_compile_arguments(arguments: dict) -> None:
    """``torch.compile``'s ``mode`` and ``options``, which Dynamo hands every backend.

    ``mode`` chooses among Inductor's code generators and CUDA graphs; a compiled call here
    always replays one XLA executable, so it changes nothing: ignored with a warning, as
    PyTorch's other backends do. ``options`` would be settings, and ignoring them could change
    numbers (a precision), so they are an error, as unknown options are for Inductor.
    """
    from ._logging import warn_once
    from .errors import ConfigError
    arguments = dict(arguments)
    options = arguments.pop("options", None)
    if options:
        raise ConfigError(
            f"torch.compile(backend='torchtpu', options={options!r}): the torchtpu backend "
            f"takes no options; its settings are torchtpu_compile.config's, set in code or "
            f"in the environment: e.g. torchtpu_compile.config.matmul_precision = 'highest' "
            f"before the first call, or TORCHTPU_MATMUL_PRECISION=highest (every setting: "
            f"docs/configuration.md)")
    if arguments:
        warn_once(("compile arguments", tuple(sorted(arguments))),
                  "torchtpu backend ignoring torch.compile arguments %s: a compiled call runs "
                  "one XLA executable whatever the mode", arguments)


def _device_error(gm: torch.fx.GraphModule) -> RuntimeError | None:
    """The error eager raises for a tensor the graph makes on a device index past its type's
    count (``x.to("tpu:1")`` with one tpu device), or None; our program's result would have
    landed on device 0. One pass per graph compiled."""
    seen = set()
    for node in gm.graph.nodes:
        value = node.meta.get("example_value")
        if not isinstance(value, torch.Tensor) or not value.device.index:
            continue
        device = value.device
        if device in seen:
            continue
        seen.add(device)
        count = getattr(getattr(torch, device.type, None), "device_count", None)
        if count is not None and device.index >= count():
            return RuntimeError(
                f"{device} does not exist: torch.{device.type}.device_count() is {count()} "
                f"(made by {node.format_node()})")
    return None


def _in_eager(gm: torch.fx.GraphModule, op: str, description: str, reason: str):
    """``gm`` run by eager PyTorch, whole, under the fallback policy (counted and warned, or
    an error under strict): where eager returns a value, so does the compiled call."""
    from .fallback_policy import fall_back
    fall_back(op, description, reason, path="compile")
    return gm.forward


def _raising(error: BaseException):
    """A compiled function that raises ``error``'s like at every call, as eager does."""
    from .dtype_support import _fresh

    def refused(*args, **kwargs):
        raise _fresh(error)
    return refused


@contextlib.contextmanager
def _mkldnn_off():
    """mkldnn off for this block, nothing else touched. ``torch.backends.mkldnn.flags``
    also sets oneDNN's TF32 and fp32-precision flags, and on a CPU build warns that TF32 needs
    an Intel GPU: one UserWarning in every process that compiled."""
    before = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(before)


_CONVOLUTIONS = {torch.conv1d, torch.conv2d, torch.conv3d, torch.conv_transpose1d,
                 torch.conv_transpose2d, torch.conv_transpose3d, torch.convolution}


def _results_in_eager_layout(gm: torch.fx.GraphModule) -> None:
    """Each scaled_dot_product_attention and convolution result laid out as eager's.

    aot_autograd traces attention as its math formulation (below), whose result is contiguous,
    while the CPU's flash kernel lays its output out as the query: with a query transposed from
    (N, L, H, E), the SDPA tutorial's ``y.transpose(1, 2).view(N, L, H * E)`` works in eager
    and failed here ("Cannot view a tensor ..."). Dynamo's example value holds eager's strides.
    A convolution of channels-last inputs is channels-last in eager, but the fake convolution
    picks no CPU backend on the tpu device (nor for a transposed one with mkldnn off, as the
    trace runs): it came out contiguous, and so did everything computed from it. Its layout is
    the fake convolution's on CPU tensors of the same strides, mkldnn on, as eager's CPU run.
    """
    from .output_slots import memory_order
    sdpa = torch._C._nn.scaled_dot_product_attention
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or (node.target is not sdpa and
                                          node.target not in _CONVOLUTIONS):
            continue
        val = node.meta.get("example_value")
        # (Even where the example value has it: aot_autograd traces again, mkldnn off.)
        order = memory_order(val if node.target is sdpa else _eager_convolution(node))
        if order is None:  # contiguous, or symbolic
            continue
        order = tuple(order)
        changed = True
        users = list(node.users)
        inverse = tuple(order.index(d) for d in range(len(order)))
        # Plain tensor methods, as Dynamo writes them: the graph cache keys them (graph_cache.py)
        with gm.graph.inserting_after(node):
            permuted = gm.graph.call_method("permute", (node, order))
        with gm.graph.inserting_after(permuted):
            dense = gm.graph.call_method("contiguous", (permuted,))
        with gm.graph.inserting_after(dense):
            laid_out = gm.graph.call_method("permute", (dense, inverse))
        with val.fake_mode:  # their example values too: torch's cache checks them
            values = (val.permute(order),)
            values += (values[0].contiguous(),)
            values += (values[1].permute(inverse),)
        for new, value in zip((permuted, dense, laid_out), values):
            new.meta = {**node.meta, "example_value": value}
        for user in users:
            user.replace_input_with(node, laid_out)
    if changed:
        gm.recompile()


def _eager_convolution(node: torch.fx.Node):
    """A convolution node's result as eager's CPU kernel lays it out: the op run in the trace's
    fake mode on CPU tensors of its arguments' sizes and strides; None where that cannot be
    told (symbolic sizes, no example values)."""
    val = node.meta.get("example_value")
    if not isinstance(val, torch.Tensor):
        return None

    def on_cpu(arg):
        if isinstance(arg, torch.fx.Node):
            value = arg.meta.get("example_value")
            if not isinstance(value, torch.Tensor):
                raise LookupError(arg)
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                       device="cpu")
        return arg

    try:
        with val.fake_mode:
            args = torch.fx.node.map_aggregate(node.args, on_cpu)
            kwargs = torch.fx.node.map_aggregate(node.kwargs, on_cpu)
            return node.target(*args, **kwargs)
    except Exception:  # symbolic sizes, an argument without a value: left as traced
        return None


def attention_with_causal_mask_merged(query, key, value, attn_mask=None, dropout_p=0.0,
                                      is_causal=False, **options):
    """``F.scaled_dot_product_attention`` given a mask and ``is_causal`` together, as eager's
    CPU kernel runs it (``decompositions.attention.causal_mask_merged``)."""
    from .lower.decompositions.attention import causal_mask_merged
    attn_mask, is_causal = causal_mask_merged(query, key, attn_mask, is_causal)
    return torch._C._nn.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                     is_causal, **options)


def _causal_and_mask_merged(gm: torch.fx.GraphModule) -> None:
    """Attention given both a mask and ``is_causal=True`` runs with them merged: aot_autograd
    traces its math formulation, which refuses the pair ("Explicit attn_mask should not be
    set when is_causal=True"), where eager's CPU kernel takes both."""
    sdpa = torch._C._nn.scaled_dot_product_attention
    changed = False
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not sdpa:
            continue
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
        bound = {**dict(zip(names, node.args)), **node.kwargs}
        if bound.get("attn_mask") is not None and bound.get("is_causal") is True:
            node.target = attention_with_causal_mask_merged
            changed = True
    if changed:
        gm.recompile()


def torchtpu_backend(gm: torch.fx.GraphModule, example_inputs, **options):
    """Compile a Dynamo FX graph for the PJRT device.

    Example::

        compiled = torch.compile(torch.nn.Linear(4, 4), backend="torchtpu")
        compiled(torch.randn(2, 4))
    """
    _check_compile_arguments(options)
    # Where eager raises, so does every call, and nothing is lowered: a device that does not
    # exist, or a dtype eager's CPU kernels refuse that XLA would take (bmm of bool;
    # dtype_support.py, once per signature, at compile time only).
    from .dtype_support import graph_error
    refused = _device_error(gm) or graph_error(gm)
    if refused is not None:
        return _raising(refused)
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from . import graph_cache
    from .host_semantics import host_factories
    from .profiling import spanning

    from .descriptor_guards import guard_descriptors
    guard_descriptors()
    # Both before the graph cache keys the graph.
    _results_in_eager_layout(gm)
    _causal_and_mask_merged(gm)
    from .aliased_outputs import InputViews
    whole = gm
    gm, views = InputViews.split(gm)
    graph_id = next(_backend_ids)
    # Inside the scope, aot_autograd first looks for this graph's result in the graph cache
    # and, on a miss, saves what it builds (graph_cache.py).
    with spanning("torchtpu::backend_compile", graph=graph_id), \
            graph_cache.scope(gm, example_inputs) as cached:
        aot = aot_autograd(
            fw_compiler=_compiler("forward", graph_id, cached),
            bw_compiler=_compiler("backward", graph_id, cached),
            inference_compiler=_compiler("inference", graph_id, cached),
            decompositions=_decompositions(),
            partition_fn=min_cut_rematerialization_partition,
        )
        # The fused CPU attention kernels (_scaled_dot_product_flash_attention_for_cpu) do not
        # lower; the math formulation does, and XLA fuses it anyway. Likewise aten.lstm's
        # decomposition picks mkldnn's layer kernel (mkldnn_rnn_layer) for CPU tensors when
        # mkldnn is on: an nn.LSTM under allow_rnn ran on the host; the generic cells lower.
        with sdpa_kernel(SDPBackend.MATH), _mkldnn_off(), host_factories(), \
                spanning("torchtpu::aot_autograd"):
            try:
                compiled = aot(gm, example_inputs)
            except errors.InvalidInputError as exc:
                # Inputs eager refuses (max() of an empty tensor): raised at every call, as
                # eager's type; raised from here, Dynamo wrapped all but an IndexError in
                # BackendCompilerFailed.
                message = str(exc).split("\n\nWhile executing")[0]   # FX's note on the node
                return _raising(type(exc)(message))
            except AssertionError as exc:
                if "set_ on a graph input" not in str(exc):
                    raise
                return _in_eager(whole, "aten.set_", "a graph that sets the storage of an input "
                                 "(`p.data = ...`)", "aot_autograd keeps no input's set_ in a "
                                 "program it compiles")
    if views is not None:
        # Not keyed for the Dynamo-level cache: it would rebuild the split graph's function
        # alone, without the outputs made here.
        return views.around(compiled)
    # Where the Dynamo-level cache finds this graph again (dynamo_cache.py). On the innermost
    # function: Dynamo's disable() unwraps aot_autograd's wrapper before wrapping it again.
    from torch._dynamo.eval_frame import innermost_fn
    innermost_fn(compiled)._torchtpu_aot_key = graph_cache.last_entry_key()
    return compiled


# Likewise, graph breaks must be reported (graph_breaks.py: counted, or strict errors) before
# the first is traced, and the Dynamo-level cache hooked in before the first frame is converted,
# whether or not it is on now: it asks config.dynamo_cache at each frame (off, the frame goes
# to Dynamo as it would), so that turning it on in code later takes effect. Both are told
# which backend is ours; neither imports this module.
from . import graph_breaks as _graph_breaks  # noqa: E402
_graph_breaks.install(torchtpu_backend)
# Our machinery works below the graph, and runs inside frames Dynamo evaluates: the runtime's
# buffer finalizers (runtime/memory.py) whenever a buffer dies, and lowering and program
# building whenever the eager device meets a new op, as it does for code Dynamo leaves to run
# eagerly on tpu tensors (nn.LSTM). Dynamo must never trace it: it compiled our own frames
# (dozens of graph breaks per new op, inside FX, MLIR and hashlib), and the libraries below
# ours (torch-mlir's importer, JAX). Only what user code calls inside a compiled function stays
# traceable: jax_op kernels and the config.
from torch._dynamo import trace_rules as _trace_rules  # noqa: E402


def _below_the_graph() -> list:
    import os
    import pkgutil
    here = os.path.dirname(os.path.abspath(__file__))
    ours = [f"{__package__}.{info.name}" for info in pkgutil.iter_modules([here])
            if info.name not in ("kernels", "config")]
    return ours + ["torch_mlir", "jax", "jaxlib"]  # what our lowering and runtime call


for _module in _below_the_graph():
    _trace_rules.add(_module)
from . import dynamo_cache as _dynamo_cache  # noqa: E402
_dynamo_cache.install(torchtpu_backend)
# And decompositions PyTorch runs above autograd while Dynamo traces (losses.py) take ours
# before the first frame is traced.
from .lower.decompositions import losses as _losses  # noqa: E402
_losses.install_above_autograd()
