"""The one run path: a compiled executable and its calling convention, from inputs to outputs.

Every program torchtpu runs is a ``Program``: compiled graphs (``runner.GraphRunner``), the
eager device's single-op and fused programs, loaded AOT artifacts and tpu_dist's collectives.
It holds the executable (``runtime/executable.py``) and the calling convention the lowering
recorded (``lower/calling_convention.py``): which of the caller's arguments are program inputs,
the graph's constants (uploaded once: resident), the inputs drawn on the host at each call
(random numbers), and the output slots that rebuild the graph's outputs (``output_slots.py``).
Two entry points, one path:

- ``run(buffers)``: PJRT buffers in, PJRT buffers out (the eager device, tpu_dist);
- ``__call__(args)``: tensors in, tensors out (compiled graphs, AOT artifacts): tensors become
  buffers through ``runtime/transfer.py`` (parameters resident), results become tensors of the
  device each output was traced on (or of ``device``: an artifact's inputs').

``compile_program`` is the builder's compile half (``build.py`` is its lower half): StableHLO
through the one executable cache to a ``Program``. This module imports no lowering (no
torch-mlir): the AOT loader runs its programs through it.

Example::

    program = compile_program(stablehlo_text, precision="highest", name="add")
    [out] = program.run([buffer_a, buffer_b])           # identity convention: all in, all out
"""
from __future__ import annotations

import hashlib

from ..output_slots import check_index, collect_outputs, empty_tensor, results_are_outputs
from ..profiling import TORCH_PROFILER, around, reentered
from ..runtime import memory
from ..runtime.client import get_client
from ..runtime.device_tensors import WRAPPERS
from ..runtime.executable import compile_stablehlo
from ..runtime.transfer import adopt, host_tensors, to_buffer, to_buffers, wrapper_for


class Program:
    """One executable plus the calling convention around it (module doc).

    ``executable``: a runtime ``Executable``, or None when there is nothing to compute (every
    output an input, a constant or None). ``arg_indices``: the caller's arguments that are
    program inputs, in order (None: all of them); ``slots``: the ``OutputSlot`` of each output
    (None: the results are the outputs); ``constants``: tensors passed after the arguments,
    resident; ``random_inputs``: ``HostDraw``s, drawn at each call and passed last;
    ``resident_inputs``: positions of arguments kept on the device across calls (parameters);
    ``result_devices``: the device type each program result was traced on (default: each
    call's ``device``, else the host).
    ``lowered`` (its ``LoweredModule``) and ``prepared`` (its ``PreparedGraph``) say what it
    was built from, where the builder made it.

    Example::

        program = Program(executable, arg_indices=[0, 1], slots=[OutputSlot("program", 0)])
        [y] = program([x, w])
    """

    def __init__(self, executable, *, arg_indices=None, slots=None, constants=(),
                 random_inputs=(), name: str = "program", resident_inputs=frozenset(),
                 result_devices=None, lowered=None, prepared=None):
        self.executable = executable
        self.arg_indices = arg_indices
        self.slots = slots
        self.constants = list(constants)
        self.random_inputs = list(random_inputs)
        self.name = name
        self.resident_inputs = resident_inputs
        self.lowered = lowered
        self.prepared = prepared
        self.client = get_client()
        # The identity convention (StableHLO from elsewhere): buffers straight to the executable.
        self._plain = arg_indices is None and slots is None and not constants and \
            not random_inputs
        # Inputs beyond the caller's (constants, host draws): most programs have none, and a
        # call less per run counts on the eager device's per-op path.
        self._extra = bool(self.constants or self.random_inputs)
        self._direct = slots is None or results_are_outputs(slots)
        self._check = None if slots is None else check_index(slots)
        self._on_device: dict = {}   # device type -> (result wrappers, defer checks)
        self._wrap, self._defer_checks, self._host = None, False, False
        self._plan = None            # (argument index, resident) per input, from the first call
        # (argument, result) pairs: host inputs the graph writes in place that may take their
        # result's memory instead of a copy of it (``adopt_inputs``).
        self._adopt = ()
        if result_devices is not None:
            # Every result a host tensor (no device's own tensors), but the index checks'
            # output, kept a buffer (a static KV cache's update is checked at every step).
            self._host = not any(device in WRAPPERS for i, device in enumerate(result_devices)
                                 if i != self._check)
            self._wrap = self._wrappers(list(result_devices))
            # Index checks of results left on the device are read at its next synchronization.
            self._defer_checks = any(device != "cpu" for i, device in
                                     enumerate(result_devices) if i != self._check)

    @property
    def precision_sensitive(self) -> bool:
        """Whether another matmul precision could compile another program (``LoweredModule.
        precision_sensitive``); False for a program with nothing to compute."""
        return self.lowered is not None and self.lowered.precision_sensitive

    def _wrappers(self, devices: list) -> list:
        wrap = [wrapper_for(device) for device in devices]
        if self._check is not None:  # the index checks' output stays a buffer (index_errors)
            wrap[self._check] = _unwrapped
        return wrap

    def _inputs(self, values: list, args: list) -> list:
        """The executable's inputs: ``values`` (the program's arguments, as buffers), then the
        constants (resident), then this call's host draws (which may read ``args``)."""
        client = self.client
        if self.constants:
            values += [to_buffer(c, True, client) for c in self.constants]
        if self.random_inputs:
            values += [to_buffer(draw(args), False, client) for draw in self.random_inputs]
        return values

    def run(self, buffers: list, locations=None) -> list:
        """Run on PJRT buffers (one per graph argument); one buffer per graph output.

        Index checks are kept for the next synchronization point (``index_errors.defer``),
        with ``locations``: where the op was called, or per entry of a fused graph.
        """
        if TORCH_PROFILER._is_profiler_enabled and not reentered():
            return around("torchtpu::run " + self.name, self.run, buffers, locations)
        executable = self.executable
        if self._plain:
            return executable.run(buffers)
        results = ()
        if executable is not None:
            inputs = [buffers[i] for i in self.arg_indices]
            results = executable.run(self._inputs(inputs, buffers) if self._extra else inputs)
        if self._direct:  # most eager ops: the results are the outputs, as they come
            return results
        return collect_outputs(self.slots, results, buffers, defer_checks=True,
                               locations=locations, empty=_empty_buffer)

    def direct_run(self):
        """``(run, indices)`` where ``self.run(buffers)`` is nothing but ``run`` (the
        executable's) on ``buffers`` (``indices`` None) or on ``[buffers[i] for i in indices]``:
        no constants, host draws or output slots to rebuild. None for any other program. The
        eager device's per-op fast path calls it directly (``torchtpu_eager/dispatch.py``).

        Example::

            run, indices = program.direct_run()
            [out] = run([buffer])
        """
        if self.executable is None or self._extra or not self._direct:
            return None
        return self.executable.run, None if self._plain else self.arg_indices

    def __call__(self, args: list, device: str | None = None) -> list:
        """Run on tensors; the graph's outputs as tensors (results on their traced device, or
        on ``device``), rebuilt from the slots: inputs, constants, views, None."""
        if TORCH_PROFILER._is_profiler_enabled and not reentered():
            return around("torchtpu::run " + self.name, self, args, device)
        results = []
        defer = False
        executable = self.executable
        if executable is not None:
            # Host results of earlier calls that died since (a backward's saved activations,
            # gradients set to None) are freed before this call allocates its own.
            memory.release_dropped()
            plan = self._plan
            if plan is None:
                plan = self._arg_plan(len(args))
            values, made, count = to_buffers(args, plan, self.client)
            if self._extra:
                values = self._inputs(values, args)
            if device is None and self._wrap is not None:
                host = self._host
            else:
                host = (device or "cpu") not in WRAPPERS and self._check is None
            out = executable.run(values)
            if count:  # the inputs uploaded for this call alone die with it
                memory.transient(made, count)
            if host:
                check = self._check
                if check is None:
                    results = host_tensors(out, self.client)
                else:  # kept a buffer (index_errors reads it)
                    kept = out.pop(check)
                    results = host_tensors(out, self.client)
                    results.insert(check, kept)
                if self._adopt:
                    self._adopt_results(args, out, results)
            else:
                if device is None and self._wrap is not None:
                    wrap, defer = self._wrap, self._defer_checks
                else:
                    wrap, defer = self._for_device(device or "cpu", len(out))
                results = [w(b) for w, b in zip(wrap, out)]
        if self._direct:
            return results
        return collect_outputs(self.slots, results, args, device, defer_checks=defer)

    def adopt_inputs(self, pairs) -> None:
        """Host inputs written in place by the program (``pairs``: (argument index, result
        index), the result being the argument's new value, as aot_autograd's mutated inputs)
        take the result's memory where nothing else sees theirs (``transfer.adopt``): the
        argument itself is then returned for that result, so that aot_autograd's copy of the
        new value into it is a no-op, and its resident buffer is the result's (no whole-cache
        copy or upload per decode step). CPU client only: elsewhere results are host copies.

        Example::

            program.adopt_inputs([(3, 0)])      # argument 3's new value is result 0
        """
        self._adopt = tuple(pairs) if self.client.platform == "cpu" else ()

    def _adopt_results(self, args: list, out: list, results: list) -> None:
        check = self._check  # its buffer was taken out of ``out``
        for i, r in self._adopt:
            tensor = args[i]
            if adopt(tensor, out[r if check is None or r < check else r - 1], results[r]):
                results[r] = tensor

    def _arg_plan(self, count: int) -> list:
        """(argument index, resident) for each program input (``transfer.to_buffers``): fixed
        per program, except under the identity convention (every argument, however many)."""
        indices = range(count) if self.arg_indices is None else self.arg_indices
        plan = [(i, i in self.resident_inputs) for i in indices]
        if self.arg_indices is not None:
            self._plan = plan
        return plan

    def _for_device(self, device: str, count: int) -> tuple:
        known = self._on_device.get(device)
        if known is None:
            known = self._on_device[device] = (self._wrappers([device] * count),
                                               device != "cpu")
        return known


def _unwrapped(buffer):
    return buffer


def _empty_buffer(spec: list):
    """A buffer holding a tensor with no elements (the eager device's "empty" slots)."""
    return to_buffer(empty_tensor(spec, "cpu"))


def compile_program(stablehlo, *, precision: str, name: str, replicas: tuple = (),
                    donate: dict | None = None, **convention) -> Program:
    """The compile half of the builder: StableHLO through the one executable cache to a
    ``Program`` (keyword arguments: its calling convention, as ``Program`` takes them).

    ``stablehlo``: the builder's ``LoweredModule`` (bytecode, fingerprint and devices of its
    own), or StableHLO text (tpu_dist's collectives: fingerprinted here, placed on
    ``replicas``, one replica per device id). ``donate`` ({program input: result}): inputs
    whose buffers the program reuses for those results (``donation.py``).

    Example::

        exe = compile_program(text, precision="collective", name="tpu_dist all_reduce",
                              replicas=(0, 2048))
        outs = exe.run(buffers)
    """
    if isinstance(stablehlo, str):
        bytecode, lowered = stablehlo.encode(), None
        fingerprint = hashlib.sha256(bytecode).hexdigest()
    else:
        bytecode, fingerprint, replicas = stablehlo.bytecode, stablehlo.fingerprint, \
            stablehlo.replicas
        lowered = stablehlo
    executable = compile_stablehlo(bytecode, fingerprint, precision, what=name,
                                   replicas=replicas, donate=donate)
    return Program(executable, name=name, lowered=lowered, **convention)
