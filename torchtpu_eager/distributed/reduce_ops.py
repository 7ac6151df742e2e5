"""Which reduce ops tpu_dist supports, and what each one asks of the transport.

Gloo has no AVG: an average is a sum divided by the group size after the transport. An op the
transport cannot do (PREMUL_SUM, bitwise ops on floats, a name nobody knows) is a ValueError
naming the ops that work, raised before anything is sent, so no rank is left waiting.

Example::

    transport_op, divide = resolve(dist.ReduceOp.AVG, torch.float32)   # (SUM, True)
"""
from __future__ import annotations

import torch
import torch.distributed as dist

RedOp = dist.ReduceOp
_FLOAT_OPS = {"sum": RedOp.SUM, "avg": RedOp.AVG, "max": RedOp.MAX, "min": RedOp.MIN,
              "product": RedOp.PRODUCT}
_BITWISE = {"band": RedOp.BAND, "bor": RedOp.BOR, "bxor": RedOp.BXOR}
_SUPPORTED = "sum, avg, max, min, product (and band, bor, bxor on integer tensors)"


def name(op) -> str:
    """The lowercase name of a ReduceOp, RedOpType or string ("sum", "max", "band", ...)."""
    if isinstance(op, str):
        return op.lower()
    kind = getattr(op, "op", op)  # a ReduceOp wraps a RedOpType
    for name, value in {**_FLOAT_OPS, **_BITWISE, "premul_sum": RedOp.PREMUL_SUM}.items():
        if kind == value:
            return name
    return str(op)


def resolve(op, dtype: torch.dtype):
    """(the RedOpType the transport runs, whether to divide by the group size afterwards).

    Example::

        resolve("max", torch.float32)      # (ReduceOp.MAX, False)
    """
    known = name(op)
    if known == "avg" and dtype == torch.bool:
        # NCCL's error; a sum divided toward zero made every True False.
        raise TypeError("Cannot use ReduceOp.AVG with boolean inputs")
    if known in _FLOAT_OPS:
        return (RedOp.SUM, True) if known == "avg" else (_FLOAT_OPS[known], False)
    if known in _BITWISE:
        if dtype.is_floating_point or dtype.is_complex:
            raise ValueError(f"tpu_dist: reduce op {known} needs an integer or bool tensor, "
                             f"got {dtype}; for {dtype} use one of sum, avg, max, min, product")
        return _BITWISE[known], False
    raise ValueError(f"tpu_dist: reduce op {known} is not supported; use one of {_SUPPORTED}")


def average(host: torch.Tensor, world_size: int) -> None:
    """Divide a summed host tensor by the group size, in place (integers: toward zero)."""
    if host.dtype.is_floating_point or host.dtype.is_complex:
        host.div_(world_size)
    else:
        host.copy_(torch.div(host, world_size, rounding_mode="trunc"))
