"""``TpuProcessGroup``: the c10d process group behind ``init_process_group("tpu_dist")``.

A Python ``ProcessGroup``: ``torch.distributed`` calls its methods with tpu tensors (and CPU
tensors, which go straight to gloo). Two transports carry tpu tensors:

- PJRT (``pjrt_transport.py``): the processes' PJRT clients are joined into one
  (``pjrt_world.py``) when the group is made, and a collective is a StableHLO program over the
  group's devices, run on the tensors' device buffers. This is the transport whenever it can be.
- host staging (``staging.py``): tpu tensors are copied to host memory, the collective runs on
  an inner gloo group over the same rendezvous store, and a ``StagedWork`` copies results back
  when waited on. For what PJRT cannot carry (send/recv, gather/scatter, uneven all_to_all,
  bitwise reductions, complex dtypes) and for a whole group whose client could not be joined
  (made before ``init_process_group``): said once in the log, counted in stats.

Timeouts are the group's (``init_process_group(timeout=...)``): a rank that dies or never joins
gives an error on the others, never a hang. Before each collective the ranks compare its
signature over gloo (``_check``), bounded by the timeout; the transports error at once when a
peer's connection closes. A rank whose process has ended (``pjrt_world.gone``: killed, crashed
or exited) makes every later collective of a group holding it raise ``DistBackendError``
naming it, at once; the survivors can still save their state and ``destroy_process_group()``.

Example::

    dist.init_process_group("tpu_dist", rank=r, world_size=2, init_method="tcp://127.0.0.1:29500")
    t = torch.arange(4.0, device="tpu")
    dist.broadcast(t, src=0)
"""
from __future__ import annotations

import zlib

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (AllgatherOptions, AllreduceOptions, AllToAllOptions,
                                        BarrierOptions, PrefixStore, ProcessGroupGloo,
                                        ReduceOptions, ReduceScatterOptions)

from torchtpu_compile import config
from torchtpu_compile._logging import log, warn_once
from torchtpu_compile.lower import collective_graphs

from . import functional, pjrt_world, reduce_ops
from .pjrt_transport import PjrtTransport
from .staging import host_input, host_output, is_tpu, note, stage_in, stage_out
from .stats import COUNTERS
from .work import StagedWork, collective_error, eager_only, gone_peers_error


def _stage_output_lists(output_lists):
    """Host buffers for per-rank output lists (not read: written), nested the same way."""
    host_out, back = stage_in(_flat(output_lists), read=False, count=False)
    it = iter(host_out)
    return [[next(it) for _ in outs] for outs in output_lists], back


def _flat(nested) -> list:
    return [t for inner in nested for t in inner]


class TpuProcessGroup(dist.ProcessGroup):
    """Collectives on tpu tensors for ``world_size`` processes (one tpu device each)."""

    def __init__(self, store, rank: int, world_size: int, timeout):
        super().__init__(rank, world_size)
        functional.register()
        # Compiled graphs lower the collectives of a group on the PJRT transport in-program.
        collective_graphs.set_group_resolver(functional.group_devices)
        # FSDP2 frees and re-allocates parameter storage; tpu storages need their own way.
        from ..storage_ops import install_fsdp_hooks
        install_fsdp_hooks()
        self._rank, self._world_size, self._timeout = rank, world_size, timeout
        self._gloo = ProcessGroupGloo(PrefixStore("tpu_dist_gloo/", store), rank, world_size,
                                      timeout)
        # PyTorch keeps a group's name (which functional collectives and DTensor resolve it
        # by) in its registered backends; gloo is also the right backend for CPU tensors.
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO,
                               self._gloo)
        devices, self._staged_why = pjrt_world.placement(store, rank, world_size, timeout)
        self._pjrt = PjrtTransport(devices) if devices else None
        # The group's ranks in the joined world, whose ends ``_alive`` looks for.
        self._processes = pjrt_world.processes_of(devices) if devices else None
        if self._pjrt is None:
            COUNTERS.add("host_staged_groups")
            warn_once(("tpu_dist", "group staged", self._staged_why),
                      "torchtpu: tpu_dist collectives of this group are staged through host "
                      "memory: %s", self._staged_why)
        log.info("torchtpu: tpu_dist process group rank %d of %d (timeout %s, transport %s)",
                 rank, world_size, timeout, "PJRT" if self._pjrt else "host staging")

    def getBackendName(self) -> str:
        return "tpu_dist"

    def name(self) -> str:
        return "tpu_dist"

    def __repr__(self) -> str:
        return f"TpuProcessGroup(rank={self._rank}, world_size={self._world_size})"

    # --- helpers --------------------------------------------------------------------------

    def _alive(self, name: str) -> None:
        """Raise DistBackendError if a rank of this group has ended: ``name`` would fail on
        its closed connections, or wait for it until the timeout."""
        if self._processes is not None:
            error = gone_peers_error(name, self._processes)
            if error is not None:
                raise error

    def _check(self, name: str, tensors, shapes: bool = True) -> None:
        """Raise on every rank if the ranks disagree on this collective's shapes or dtypes.

        Gloo on host buffers of different sizes can return wrong values without an error;
        one small MAX all-reduce of (h, -h), h a checksum of the signature, finds a
        disagreement on all ranks at once (max(h) == -max(-h) only when every h is equal).
        ``TORCHTPU_DIST_CHECK=0`` skips it. Collectives of CPU tensors only skip it too: they
        behave exactly as on a gloo group (this group serves them when ``init_process_group``
        is given no backend, or "cpu:gloo,tpu:tpu_dist").
        """
        self._alive(name)
        if not config.dist_check or not any(is_tpu(t) for t in tensors):
            return
        described = ",".join(f"{str(t.dtype)[6:]}{list(t.shape) if shapes else ''}"
                             for t in tensors)
        signature = f"{name}({described})"
        h = zlib.crc32(signature.encode())
        probe = torch.tensor([h, -h], dtype=torch.int64)
        opts = AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        try:
            self._gloo.allreduce([probe], opts).wait()
        except Exception as exc:
            raise collective_error(name, exc) from exc
        if probe[0].item() != -probe[1].item():
            raise RuntimeError(
                f"tpu_dist: ranks called {name} with different shapes or dtypes (rank "
                f"{self._rank}: {signature}); every rank must pass tensors of the same shape "
                f"and dtype to a collective")

    def _on_pjrt(self, name: str, tensors, call, why: str | None = None):
        """``call(transport)``'s work if the PJRT transport carries this collective, else None
        (the caller stages it; why is said once per collective kind)."""
        self._alive(name)
        if self._pjrt is not None and call is not None:
            work = call(self._pjrt)
            if work is not None:
                return work
        if any(is_tpu(t) for t in tensors):
            why = self._staged_why or why or \
                "not carried by PJRT collectives: complex dtypes, bitwise reductions, " \
                "unequal chunks or empty tensors"
            warn_once(("tpu_dist", "staged", name, why),
                      "torchtpu: tpu_dist %s on %s is staged through host memory (%s)", name,
                      ", ".join(sorted({f"{str(t.dtype)[6:]}" for t in tensors})), why)
        return None

    def _work(self, inner, back, result, after=None) -> StagedWork:
        COUNTERS.add("collectives")

        def finish():
            if after is not None:
                after()
            stage_out(back)
        return StagedWork(inner, finish, result)

    def _reduce_opts(self, opts, dtype, kind=AllreduceOptions):
        op, divide = reduce_ops.resolve(opts.reduceOp, dtype)
        new = kind()
        new.reduceOp = op
        new.timeout = opts.timeout
        if hasattr(opts, "rootRank"):
            new.rootRank, new.rootTensor = opts.rootRank, opts.rootTensor
        return new, divide

    # --- reductions -----------------------------------------------------------------------

    def allreduce(self, tensors, opts=AllreduceOptions()):
        self._check("all_reduce", tensors)
        gloo_opts, divide = self._reduce_opts(opts, tensors[0].dtype)
        work = self._on_pjrt("all_reduce", tensors, lambda p: p.all_reduce(
            tensors, reduce_ops.name(gloo_opts.reduceOp), divide))
        if work is not None:
            return work
        host, back = stage_in(tensors)
        inner = self._gloo.allreduce(host, gloo_opts)
        after = (lambda: [reduce_ops.average(h, self._world_size) for h in host]) \
            if divide else None
        return self._work(inner, back, tensors, after)

    def allreduce_coalesced(self, tensors, opts=AllreduceOptions()):
        # One flat buffer: one transport call for the bucket, as gloo's coalesced op does.
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts=ReduceOptions()):
        self._check("reduce", tensors)
        gloo_opts, divide = self._reduce_opts(opts, tensors[0].dtype, ReduceOptions)
        root = opts.rootRank == self._rank
        work = self._on_pjrt("reduce", tensors, lambda p: p.all_reduce(
            tensors, reduce_ops.name(gloo_opts.reduceOp), divide,
            outputs=tensors if root else []))
        if work is not None:
            return work
        host, back = stage_in(tensors)
        inner = self._gloo.reduce(host, gloo_opts)
        after = (lambda: [reduce_ops.average(h, self._world_size) for h in host]) \
            if divide and root else None
        return self._work(inner, back if root else [], tensors, after)

    def reduce_scatter(self, outputs, inputs, opts=ReduceScatterOptions()):
        if len(outputs) == 1:
            work = self._reduce_scatter_on_pjrt(outputs[0], list(inputs[0]), opts)
            if work is not None:
                return work
        return self._reduce_scatter(outputs, inputs[0], opts, list(inputs[0]) + list(outputs))

    def _reduce_scatter_on_pjrt(self, output, inputs, opts):
        if self._pjrt is None:  # staged: the staged path checks and counts it
            return None
        self._check("reduce_scatter", list(inputs) + [output])
        op, divide = reduce_ops.resolve(opts.reduceOp, output.dtype)
        return self._on_pjrt("reduce_scatter", inputs + [output], lambda p: p.reduce_scatter(
            output, inputs, reduce_ops.name(op), divide, [output]))

    def _reduce_scatter(self, outputs, chunks, opts, staged):
        # As a sum of everything then a local slice: gloo's reduce_scatter needs equal chunks
        # on the host anyway, and this keeps every rank's view of the op identical.
        # ``staged``: the caller's tensors, counted as one host-staged collective.
        self._check("reduce_scatter", list(chunks) + list(outputs))
        flat_in = torch.cat([host_input(c).reshape(-1) for c in chunks])
        gloo_opts, divide = self._reduce_opts(opts, chunks[0].dtype)
        note(staged)
        inner = self._gloo.allreduce([flat_in], gloo_opts)
        sizes = [c.numel() for c in chunks]
        host_out = host_output(outputs[0])
        back = [(outputs[0], host_out)] if host_out is not outputs[0] else []

        def after():
            mine = torch.split(flat_in, sizes)[self._rank]
            if divide:
                mine = mine.clone()
                reduce_ops.average(mine, self._world_size)
            host_out.copy_(mine.reshape(host_out.shape))
        return self._work(inner, back, outputs, after)

    def reduce_scatter_single(self, output, input, opts=ReduceScatterOptions()):
        work = self._reduce_scatter_on_pjrt(output, [input], opts)
        if work is not None:
            return work
        # The input is read to the host whole, then chunked there: one transfer, and no
        # device program per chunk view (FSDP2 reduce-scatters every gradient bucket).
        chunks = list(torch.chunk(host_input(input), self._world_size))
        return self._reduce_scatter([output], chunks, opts, [input, output])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=ReduceScatterOptions()):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _all_of(works, outputs)

    # --- data movement --------------------------------------------------------------------

    def broadcast(self, tensors, opts=dist.BroadcastOptions()):
        self._check("broadcast", tensors)
        work = self._on_pjrt("broadcast", tensors, lambda p: p.broadcast(tensors, opts.rootRank))
        if work is not None:
            return work
        root = opts.rootRank == self._rank
        host, back = stage_in(tensors, read=root)
        inner = self._gloo.broadcast(host, opts)
        return self._work(inner, [] if root else back, tensors)

    def allgather(self, output_lists, inputs, opts=AllgatherOptions()):
        self._check("all_gather", list(inputs) + _flat(output_lists))
        if len(inputs) == 1:
            work = self._on_pjrt("all_gather", list(inputs) + _flat(output_lists),
                                 lambda p: p.all_gather(output_lists[0], inputs[0],
                                                        output_lists))
            if work is not None:
                return work
        note(list(inputs) + _flat(output_lists))  # one collective, counted once
        host_in, _ = stage_in(inputs, count=False)
        nested, back = _stage_output_lists(output_lists)
        inner = self._gloo.allgather(nested, host_in, opts)
        return self._work(inner, back, output_lists)

    def allgather_coalesced(self, output_lists, inputs, opts=AllgatherOptions()):
        works = [self.allgather([outs], [t], opts) for outs, t in zip(output_lists, inputs)]
        return _all_of(works, output_lists)

    def all_gather_single(self, output, input, opts=AllgatherOptions()):
        # Into one host buffer, written back whole: no device program per chunk view (FSDP2
        # all-gathers every parameter group before each forward and backward).
        self._check("all_gather_single", [input, output])
        work = self._on_pjrt("all_gather_into_tensor", [input, output],
                             lambda p: p.all_gather([output], input, [output]))
        if work is not None:
            return work
        note([input, output])
        host_in, host_out = host_input(input), host_output(output)
        back = [(output, host_out)] if is_tpu(output) else []
        inner = self._gloo._allgather_base(host_out, host_in, opts)
        return self._work(inner, back, [output])

    def all_gather_single_coalesced(self, outputs, inputs, opts=AllgatherOptions()):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _all_of(works, outputs)

    def gather(self, output_lists, inputs, opts=dist.GatherOptions()):
        self._on_pjrt("gather", list(inputs), None, why="gather and scatter are host-staged")
        note(list(inputs) + _flat(output_lists))
        host_in, _ = stage_in(inputs, count=False)
        nested, back = _stage_output_lists(output_lists)
        inner = self._gloo.gather(nested, host_in, opts)
        return self._work(inner, back, output_lists)

    def scatter(self, outputs, input_lists, opts=dist.ScatterOptions()):
        self._on_pjrt("scatter", list(outputs), None, why="gather and scatter are host-staged")
        note(list(outputs) + _flat(input_lists))
        host_out, back = stage_in(outputs, read=False, count=False)
        host_in = [[host_input(t) for t in inner] for inner in input_lists]
        inner = self._gloo.scatter(host_out, host_in, opts)
        return self._work(inner, back, outputs)

    def alltoall(self, outputs, inputs, opts=AllToAllOptions()):
        # As one alltoall_base over concatenated host buffers with per-peer split sizes.
        self._check("all_to_all", inputs, shapes=False)
        work = self._on_pjrt("all_to_all", list(inputs) + list(outputs),
                             lambda p: p.all_to_all(outputs, inputs, outputs))
        if work is not None:
            return work
        flat_in = torch.cat([host_input(t).reshape(-1) for t in inputs])
        note(list(inputs) + list(outputs))
        out_sizes = [t.numel() for t in outputs]
        flat_out = torch.empty(sum(out_sizes), dtype=outputs[0].dtype)
        inner = self._gloo.alltoall_base(flat_out, flat_in, out_sizes,
                                         [t.numel() for t in inputs], opts)
        host_outs = [host_output(t) for t in outputs]
        back = [(t, h) for t, h in zip(outputs, host_outs) if h is not t]

        def after():
            for h, part in zip(host_outs, torch.split(flat_out, out_sizes)):
                h.copy_(part.reshape(h.shape))
        return self._work(inner, back, outputs, after)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=AllToAllOptions()):
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes,
                      opts=AllToAllOptions()):
        self._check("all_to_all_single", [input], shapes=False)
        if _equal(output_split_sizes) and _equal(input_split_sizes):
            work = self._on_pjrt("all_to_all_single", [input, output],
                                 lambda p: p.all_to_all([output], [input], [output]))
            if work is not None:
                return work
        else:
            self._on_pjrt("all_to_all_single", [input, output], None, why="uneven splits")
        note([input, output])
        [host_in], _ = stage_in([input], count=False)
        [host_out], back = stage_in([output], read=False, count=False)
        inner = self._gloo.alltoall_base(host_out, host_in, list(output_split_sizes or []),
                                         list(input_split_sizes or []), opts)
        return self._work(inner, back, [output])

    # --- point to point and barrier -------------------------------------------------------

    def send(self, tensors, dst: int, tag: int = 0):
        self._on_pjrt("send", tensors, None, why=_POINT_TO_POINT)
        host, _ = stage_in(tensors)
        return self._work(self._gloo.send(host, dst, tag), [], tensors)

    def recv(self, tensors, src: int, tag: int = 0):
        self._on_pjrt("recv", tensors, None, why=_POINT_TO_POINT)
        host, back = stage_in(tensors, read=False)
        return self._work(self._gloo.recv(host, src, tag), back, tensors)

    def recv_anysource(self, tensors, tag: int = 0):
        self._on_pjrt("recv_anysource", tensors, None, why=_POINT_TO_POINT)
        host, back = stage_in(tensors, read=False)
        return self._work(self._gloo.recv_anysource(host, tag), back, tensors)

    def barrier(self, opts=BarrierOptions()):
        self._alive("barrier")
        torch.tpu.synchronize()  # as on CUDA: work queued on the device is part of the barrier
        if self._pjrt is not None:
            return self._pjrt.barrier()
        gloo_opts = BarrierOptions()
        gloo_opts.timeout = opts.timeout
        return self._work(self._gloo.barrier(gloo_opts), [], None)

    def _start_coalescing(self, device=None):  # collectives here run one by one
        pass

    def _end_coalescing(self, device=None):
        return StagedWork(None, None, None)


#: Why send and recv are host-staged: the CPU client's gloo collectives fail
#: collective_permute (a key-value rendezvous that never completes), and a program that both
#: ranks must launch would also make a blocking send wait for its receiver.
_POINT_TO_POINT = "point-to-point is host-staged (no collective_permute on gloo)"

TpuProcessGroup = eager_only(TpuProcessGroup)


def _equal(split_sizes) -> bool:
    """Whether all_to_all split sizes are the default (none given) or all the same."""
    return not split_sizes or len(set(split_sizes)) == 1


def _all_of(works, result) -> StagedWork:
    """One handle for several works: waiting on it waits on each, in order."""
    def finish():
        for w in works:
            w.wait()
    return StagedWork(None, finish, result)
