"""Buffer donation: a program that overwrites an input may write its output into that input's
device memory (XLA input-output aliasing), so the old and the new value are never both live.

The aliasing is fixed when the program is compiled: ``with_aliasing`` marks the donated
arguments of a StableHLO module's ``main`` as jax does (``tf.aliasing_output``: the result
whose memory the argument becomes), and the executable cache keys the program on its donation
set (``donation_key``). At run time PJRT deletes a donated input buffer and hands its memory
to the result; a buffer that something outside PJRT still views (a DLPack export, a zero-copy
upload of host memory) is copied instead and stays valid, so donation never invalidates memory
that a host tensor reads. Which inputs may be donated (nothing else holds their buffer) is
the caller's to prove: ``program/donation.py`` for compiled graphs.

Example::

    bytecode = with_aliasing(lowered.bytecode, {0: 0})     # argument 0 becomes result 0
"""
from __future__ import annotations

import io

from .. import counters

#: ``stats()["donation"]``: inputs donated, inputs that could have been but were not (their
#: buffer is shared: the program without them runs), and bytes donated.
COUNTERS = counters.register("donation", lambda: {
    "donated_inputs": 0,
    "donated_bytes": 0,
    "not_donated_shared": 0,
}, under="donation")


def donation_key(aliases: dict) -> str:
    """The executable-cache key part for donation set ``aliases`` ({argument: result}).

    Example::

        donation_key({0: 2, 3: 0})     # "donate=0:2,3:0"
    """
    return "donate=" + ",".join(f"{arg}:{out}" for arg, out in sorted(aliases.items()))


def with_aliasing(bytecode: bytes, aliases: dict) -> bytes:
    """``bytecode`` (a StableHLO module, MLIR bytecode or text) with each argument ``arg`` of
    its ``main`` function marked as donated into result ``aliases[arg]``.

    Example::

        with_aliasing(module_bytes, {0: 0})      # main(%arg0 {tf.aliasing_output = 0 : i32}, ...)
    """
    from jax._src.interpreters import mlir as jax_mlir
    from jaxlib.mlir import ir

    with jax_mlir.make_ir_context():
        module = ir.Module.parse(bytecode)
        main = next(op for op in module.body.operations
                    if "sym_name" in op.attributes
                    and ir.StringAttr(op.attributes["sym_name"]).value == "main")
        count = len(main.regions[0].blocks[0].arguments)
        old = list(main.attributes["arg_attrs"]) if "arg_attrs" in main.attributes else \
            [ir.DictAttr.get({}) for _ in range(count)]
        i32 = ir.IntegerType.get_signless(32)
        new = []
        for arg, attrs in enumerate(old):
            entries = {a.name: a.attr for a in ir.DictAttr(attrs)}
            if arg in aliases:
                entries["tf.aliasing_output"] = ir.IntegerAttr.get(i32, aliases[arg])
            new.append(ir.DictAttr.get(entries))
        main.attributes["arg_attrs"] = ir.ArrayAttr.get(new)
        out = io.BytesIO()
        module.operation.write_bytecode(out)
    return out.getvalue()
