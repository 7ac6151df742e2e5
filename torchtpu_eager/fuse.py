"""Defer-and-fuse mode: ops are recorded, and run as one program at a materialization point.

Each op is still traced once into its ``OpGraph``; here the graphs are spliced into one FX
graph instead of run. The recorded graph runs, compiled as one XLA program, when a value is
needed on the host (``.cpu()``, ``.item()``, print, a data-dependent branch, ``torch.save``),
on ``torch.tpu.synchronize()``, at a mode switch, or when it grows past ``max_ops`` ops or
``max_inputs`` input buffers. Its outputs are the values still held by live tensors, so
temporaries never leave the device.

A fused program is keyed by its op sequence, wiring, input shapes and outputs, so a training
loop compiles its step once and then only hits the cache. A repeated-ops heuristic cuts the
recording where a block of ops starts repeating (stacked layers), so models of different
depths reuse the same compiled block.

A recording is compiled only once its key has been seen ``config.fuse_compile_at`` times (5);
until then its ops run one by one through their own programs, the ones strict mode runs
(cached per op signature). A loop whose recordings differ each time (a sentence of another
length, teacher forcing drawn per token) then compiles what strict mode compiles, not one
whole program per recording that it runs once or twice (each such compile costs far more than
the per-op dispatch it saves); a step that repeats is compiled at its fifth run and hits the
cache after.

Example::

    torch.tpu.set_eager_mode("defer_and_fuse")
    loss = model(x).sum()     # recorded
    loss.backward()           # recorded
    opt.step()                # recorded
    print(loss.item())        # one program (or a few blocks) runs here
"""
from __future__ import annotations

import weakref

from torchtpu_compile import config
from torchtpu_compile._logging import log
from torchtpu_compile.index_errors import caller_location
from torchtpu_compile.profiling import spanning
from torchtpu_compile.runtime.cache import RecentlyUsed

from .programs import OpGraph, splice
from .stats import COUNTERS

#: Shortest block the repeated-ops heuristic cuts at: shorter repeats are elementwise runs.
MIN_BLOCK = 8

_fused = RecentlyUsed("process_cache_programs")   # signature -> OpGraph of the recording
#: hash(signature) -> times seen, for recordings not compiled yet. A hash, not the signature:
#: a loop whose recordings all differ would keep every one's key (thousands of ids each); a
#: collision only compiles a recording a run early.
_seen: dict = {}
#: Past this many keys, ``_seen`` starts again (a bound on a loop that never repeats).
MAX_SEEN = 1 << 16


class Lazy:
    """An output of a recorded op: a PJRT buffer once its recording has run."""

    __slots__ = ("trace", "entry", "index", "buffer")

    def __init__(self, trace, entry: int, index: int):
        self.trace, self.entry, self.index, self.buffer = trace, entry, index, None

    def resolve(self):
        if self.buffer is None:
            self.trace.owner.flush(extra=(self,))
            if self.buffer is None:
                raise RuntimeError("internal error: a deferred value was dropped before it ran")
        return self.buffer


class _Recording:
    """The ops recorded since the last run."""

    def __init__(self, owner):
        self.owner = owner          # the executor that records into it
        self.graphs: list = []      # OpGraph per entry
        self.refs: list = []        # per entry: input refs, (entry, index) or -1 - input
        self.outputs: list = []     # per entry: its Lazy outputs
        self.inputs: list = []      # concrete buffers read by the recording, one per read
        self.storages: list = []    # weak references to storages holding our Lazy values
        self.locations: dict = {}   # entry -> where it was called, for entries with index checks
        self.done = False

    def record(self, graph: OpGraph, values: list) -> list:
        refs = []
        for value in values:
            if type(value) is Lazy and value.buffer is None and value.trace is self:
                refs.append((value.entry, value.index))
                continue
            # Every read is an input of its own, even of a buffer already listed: which
            # inputs share a buffer is data (a replay batch samples the same state twice,
            # and a transition's next state is the next one's state), and keyed as wiring
            # it compiled a program per step. The program is functional: sharing changes
            # nothing it computes.
            refs.append(-1 - len(self.inputs))
            self.inputs.append(value.resolve() if type(value) is Lazy else value)
        entry = len(self.graphs)
        if graph.checked:
            self.locations[entry] = caller_location()
        self.graphs.append(graph)
        self.refs.append(tuple(refs))
        count = len(graph.out_meta)
        outs = [Lazy(self, entry, 0)] if count == 1 else \
            [Lazy(self, entry, j) for j in range(count)]
        self.outputs.append(outs)
        return outs

    def _wanted(self, extra) -> list:
        wanted: dict = {}
        for ref in self.storages:
            storage = ref()
            value = storage.value if storage is not None else None
            if type(value) is Lazy and value.trace is self and value.buffer is None:
                wanted.setdefault((value.entry, value.index), None)
        for value in extra:
            if type(value) is Lazy and value.trace is self and value.buffer is None:
                wanted.setdefault((value.entry, value.index), None)
        return list(wanted)

    def run(self, extra=()) -> None:
        """Compile (or fetch) and run the recording; live values become buffers."""
        if self.done:
            return
        self.done = True
        wanted = self._wanted(extra)
        if self.graphs and wanted:
            # Shapes and dtypes from each buffer's aval: its shape and dtype properties (and
            # str of a numpy dtype) are Python calls, a dozen per input of every step.
            signature = (tuple([g.id for g in self.graphs]), tuple(self.refs),
                         tuple([(a.shape, a.dtype) for a in [b.aval for b in self.inputs]]),
                         tuple(wanted))
            program = _fused.get(signature)
            if program is not None:
                COUNTERS.add("fused_graph_cache_hits")
            elif self._seen_enough(signature):
                program = _fused[signature] = self._splice(wanted)
                log.debug("defer-and-fuse: compiling a graph of %d ops", len(self.graphs))
            if program is None:
                COUNTERS.add("fused_recordings_op_by_op")
                with spanning("torchtpu::fused_op_by_op", ops=len(self.graphs)):
                    results = self._run_op_by_op(wanted)
            else:
                COUNTERS.add("fused_graphs_run")
                with spanning("torchtpu::fused_graph", ops=len(self.graphs)):
                    results = program.run(self.inputs, self.locations)
            for (entry, index), buffer in zip(wanted, results):
                self.outputs[entry][index].buffer = buffer
        for ref in self.storages:
            storage = ref()
            value = storage.value if storage is not None else None
            if type(value) is Lazy and value.trace is self:
                storage.value = value.buffer  # None only for values nothing could read
        self.graphs = self.refs = self.outputs = self.storages = []
        self.inputs = []

    def _seen_enough(self, signature) -> bool:
        """Whether this sighting of ``signature`` is the one to compile at (module doc)."""
        if self.owner.compile_at <= 1:
            return True
        key = hash(signature)
        count = _seen.get(key, 0) + 1
        if count >= self.owner.compile_at:
            _seen.pop(key, None)
            return True
        if len(_seen) >= MAX_SEEN:
            _seen.clear()
        _seen[key] = count
        return False

    def _run_op_by_op(self, wanted: list) -> list:
        """Run each entry through its own program, as strict mode would have; the ``wanted``
        outputs' buffers. An entry nothing wanted reads is skipped (the fused program drops
        it too), unless it checks indices: its error must still be raised. An entry's outputs
        are let go after their last reader, as strict mode lets a temporary go."""
        graphs, refs, inputs = self.graphs, self.refs, self.inputs
        live = [False] * len(graphs)
        last = [-1] * len(graphs)     # the last entry reading each entry's outputs
        for entry, _ in wanted:
            live[entry] = True
            last[entry] = len(graphs)
        for entry in range(len(graphs) - 1, -1, -1):
            if live[entry] or graphs[entry].checked:
                live[entry] = True
                for ref in refs[entry]:
                    if type(ref) is tuple:
                        live[ref[0]] = True
                        last[ref[0]] = max(last[ref[0]], entry)
        produced: list = [None] * len(graphs)
        locations = self.locations
        for entry, graph in enumerate(graphs):
            if not live[entry]:
                continue
            produced[entry] = graph.run(
                [produced[r[0]][r[1]] if type(r) is tuple else inputs[-1 - r]
                 for r in refs[entry]], locations.get(entry))
            for ref in refs[entry]:
                if type(ref) is tuple and last[ref[0]] == entry:
                    produced[ref[0]] = None
        return [produced[entry][index] for entry, index in wanted]

    def _splice(self, wanted: list) -> OpGraph:
        return splice(self.graphs, self.refs, len(self.inputs), wanted,
                      f"fused[{len(self.graphs)} ops]", mark_entries=True)


class DeferAndFuse:
    """The executor of defer-and-fuse mode."""

    name = "defer_and_fuse"
    #: A part of a computed buffer is gathered now (``views._apart``): recorded, the
    #: recording's key held the whole buffer's shape (seq2seq: a sentence's length).
    reads_apart = True

    def __init__(self):
        self.max_ops = config.fuse_max_ops
        self.max_inputs = config.fuse_max_inputs
        self.cut_repeats = config.fuse_repeats
        self.compile_at = config.fuse_compile_at
        self.recording = _Recording(self)
        self._ids: list = []          # graph ids since the last cut
        self._last_seen: dict = {}    # graph id -> its last position in _ids
        self._block: list | None = None

    def check(self, graph: OpGraph) -> None:
        graph.check_lowers()

    def apply(self, graph: OpGraph, values: list, cut: bool = True) -> list:
        """Record ``graph`` on ``values``; its outputs are ``Lazy`` values of the recording.

        A cut (the recording run first, at its limits or where a block of ops repeats) keeps
        the recording's values that ``values`` and live storages hold, and no others: so
        ``cut=False`` for a read of a strided view and a never-written storage's zeros: an op
        takes the gathered value next with its other inputs, and a cut at a second read (or at
        the zeros of the view ``copy_`` writes) dropped the first read's value.
        """
        gid = graph.id
        last_seen = self._last_seen
        # An op not seen since the last cut, with no block being matched, cuts only at the
        # limits: checked here, a call less for it (_should_cut).
        if cut and (gid in last_seen or self._block is not None or
                    len(self.recording.graphs) >= self.max_ops or
                    len(self.recording.inputs) >= self.max_inputs):
            if self._should_cut(gid):
                self.flush(extra=values)
                last_seen = self._last_seen
        ids = self._ids
        last_seen[gid] = len(ids)
        ids.append(gid)
        return self.recording.record(graph, values)

    def note_write(self, storage) -> None:
        if type(storage.value) is Lazy:
            self.recording.storages.append(weakref.ref(storage))

    def flush(self, extra=()) -> None:
        recording = self.recording
        self.recording = _Recording(self)  # first: running may trigger reads
        recording.run(extra)
        self._ids = []
        self._last_seen = {}

    def _should_cut(self, gid: int) -> bool:
        recording = self.recording
        if len(recording.graphs) >= self.max_ops or len(recording.inputs) >= self.max_inputs:
            return True
        if not self.cut_repeats:
            return False
        ids = self._ids
        block = self._block
        if block is not None:
            if ids == block:
                return True           # one more whole block: run it (the cache has it)
            if ids != block[:len(ids)]:
                self._block = None    # the repetition ended
        previous = self._last_seen.get(gid)
        if previous is None:
            return False
        length = len(ids) - previous
        if length >= MIN_BLOCK and len(ids) >= 2 * length and \
                ids[-length:] == ids[-2 * length:-length]:
            self._block = ids[-length:]
            return True
        return False
