"""Random numbers drawn inside the program: dropout masks, ``rand_like``, ``randn_like`` and
``bernoulli`` come from a counter-based generator (JAX's threefry) on the device.

Drawing them on the host from torch's generator and uploading them (``config.random_draws``
"host") puts a host draw and the transfer of a whole mask into every training step: the slow
part on a TPU. Drawn here, the host draws only one key per random op per call (8 bytes each,
all in one input) from torch's default generator, so ``torch.manual_seed`` still reproduces a
run; the numbers follow the same distribution as eager's, not the same bits (as Inductor's
own random numbers). On the CPU client there is no transfer to save and XLA CPU's threefry is
no faster than torch's generator, so there "auto" keeps the host draw.

Example::

    with config.patch(random_draws="device"):
        prepared = prepare(make_fx(torch.rand_like, tracing_mode="fake")(x))
    prepared.random_inputs[0]()    # int32 [1, 2] from torch's generator: a key, not x's size
"""
from __future__ import annotations

import functools
import operator

import torch
import torch.fx as fx

from .node_values import set_value

aten = torch.ops.aten

_INT32_MIN, _INT32_END = -(1 << 31), 1 << 31


@functools.cache
def _kernels() -> dict:
    """The JAX functions behind the device draws, registered on first use (not at import)."""
    import jax
    import jax.numpy as jnp

    from ..kernels.jax_op import jax_op

    def key_of(bits):
        return jax.random.wrap_key_data(jax.lax.bitcast_convert_type(bits, jnp.uint32),
                                        impl="threefry2x32")

    def uniform_like(bits, like):
        return jax.random.uniform(key_of(bits), like.shape, like.dtype)

    def normal_like(bits, like):
        return jax.random.normal(key_of(bits), like.shape, like.dtype)

    return {"uniform": jax_op(uniform_like, name="torchtpu_uniform_like"),
            "normal": jax_op(normal_like, name="torchtpu_normal_like")}


def uniform_like(key: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """U[0, 1) with ``like``'s shape and dtype, from ``key`` (int32 [2]): on the tensors' device
    (the eager tpu device runs it as one program, as any ``jax_op``)."""
    return _kernels()["uniform"](key, like)


def enabled(platform: str | None) -> bool:
    """Whether programs for ``platform`` draw on the device (``config.random_draws``)."""
    from .. import config
    choice = config.random_draws
    return choice == "device" or (choice == "auto" and platform not in (None, "cpu"))


def _same_geometry(node: fx.Node, like: fx.Node) -> bool:
    out, src = node.meta.get("val"), like.meta.get("val")
    return (isinstance(out, torch.Tensor) and isinstance(src, torch.Tensor)
            and out.dtype == src.dtype and out.dtype.is_floating_point
            and tuple(out.shape) == tuple(src.shape))


def _uniform(node):
    return "uniform", None


def _normal(node):
    return "normal", None


def _bernoulli(node):
    return "uniform", node.args[1]


# op -> what it draws: (kernel, then a threshold or None). Only ops whose tensor argument
# gives the result's shape and dtype; the others (rand of a size, randint, ops with a
# generator state) stay host draws.
_DRAWS = {
    aten.rand_like.default: _uniform,
    aten.randn_like.default: _normal,
    aten.bernoulli.p: _bernoulli,
}


def draws_on_device(node: fx.Node) -> bool:
    """A random node this module can draw inside the program."""
    if node.op != "call_function" or node.target not in _DRAWS:
        return False
    like = node.args[0]
    extra = set(node.kwargs) - {"dtype", "layout", "device", "pin_memory", "memory_format",
                                "generator"}
    return (isinstance(like, fx.Node) and not extra and node.kwargs.get("generator") is None
            and _same_geometry(node, like))


class KeyDraw:
    """The program input that keys a graph's device draws: ``count`` keys of two int32 words,
    drawn at each call from the default generator of ``device`` (the graph's tensors': a
    graph on tpu tensors follows ``torch.tpu.manual_seed``), so ``manual_seed`` reproduces
    them."""

    def __init__(self, count: int, device: str = "cpu"):
        self.count = count
        self.device = device

    def __call__(self, args=()) -> torch.Tensor:
        return torch.randint(_INT32_MIN, _INT32_END, (self.count, 2), dtype=torch.int32,
                             device=self.device)

    def example(self) -> torch.Tensor:
        """The keys' shape and dtype, for the graph's placeholder. Not a draw: building a
        program must leave torch's generator alone, or a program built outside Dynamo's
        trace (a frame served by the Dynamo cache, a lazy backward) moves the numbers after
        ``torch.manual_seed``.

        Example::

            KeyDraw(3).example().shape   # torch.Size([3, 2]), int32
        """
        return torch.zeros((self.count, 2), dtype=torch.int32)


def rewrite(graph: fx.Graph, nodes: list, keys: fx.Node) -> None:
    """Replace each of ``nodes`` (``draws_on_device``) by a device draw keyed by row ``i`` of
    the placeholder ``keys`` (int32 [len(nodes), 2])."""
    kernels = _kernels()
    key_val = torch.empty(2, dtype=torch.int32)
    for i, node in enumerate(nodes):
        kind, threshold = _DRAWS[node.target](node)
        like, val = node.args[0], node.meta["val"]
        with graph.inserting_before(node):
            key = graph.call_function(aten.select.int, (keys, 0, i))
            set_value(key, key_val)
            call = graph.call_function(kernels[kind].op, ([key, like],))
            set_value(call, [val])
            drawn = graph.call_function(operator.getitem, (call, 0))
            set_value(drawn, val)
            if threshold is not None:  # bernoulli(p): 1 where U < p, in the input's dtype
                below = graph.call_function(aten.lt.Scalar, (drawn, threshold))
                set_value(below, torch.empty(val.shape, dtype=torch.bool))
                drawn = graph.call_function(aten._to_copy.default, (below,),
                                            {"dtype": val.dtype})
                set_value(drawn, val)
        node.replace_all_uses_with(drawn)
        graph.erase_node(node)
