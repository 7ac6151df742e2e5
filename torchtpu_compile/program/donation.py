"""Compiled graphs that overwrite their inputs reuse those inputs' device buffers (donation).

aot_autograd returns the new value of every input a graph mutates (an optimizer step's
parameters and state, batch norm's running statistics, a static KV cache) as an output, and
copies it into the input after the call. Without donation both the old and the new buffers
are live at the end of the program: a training step's peak holds every parameter and moment
twice. With it, XLA writes each new value into its input's memory (``runtime/donation.py``).

A donated buffer is deleted, so it is donated only when nothing but its tensor holds it: the
device whose tensors they are says so (``device_tensors.register_donor``; the eager tpu
device checks that no other storage, buffer reference or argument of the call shares it).
Host tensors are never donated (on the CPU client their buffers are the tensors' own memory).
The aliasing is compiled in, so a program is kept per donation set: the set of every
candidate first, built with the graph; another set (an input shared at this call: a clone
holds its buffer) compiles its own program, up to ``MAX_DONATION_SETS`` per graph; past it the
largest compiled set that fits is run, and the program that donates nothing fits always.
After the call each donated input's tensor holds the program's result (``adopt``), as the
copy aot_autograd then makes would give it.

Example::

    program = build_program(gm, precision="highest", name="step",
                            mutated_inputs=((0, 0), (1, 1)))    # input 0 -> output 0, ...
    outputs = program([param, grad])       # param's buffer became outputs[0]'s
"""
from __future__ import annotations

import collections

import torch

from ..runtime.device_tensors import DONOR_DEVICES, DONORS
from ..runtime.donation import COUNTERS

#: Programs one graph keeps for different donation sets (module doc).
MAX_DONATION_SETS = 3


def donation_candidates(prepared, mutated_inputs) -> dict:
    """{graph input: (program argument, program result, graph output)} for the mutated inputs
    (``mutated_inputs``: (graph input, graph output) pairs) whose new value the program
    computes as a result of the same shape and dtype, shown by no other output, on a device
    whose tensors can be donated.

    Example::

        donation_candidates(prepare(gm), ((0, 0),))      # {0: (0, 0, 0)}
    """
    if not mutated_inputs or not DONOR_DEVICES:
        return {}
    position = {graph_index: p for p, graph_index in enumerate(prepared.arg_indices)}
    placeholders = [n for n in prepared.gm.graph.nodes if n.op == "placeholder"]
    results = prepared.gm.graph.output_node().args[0]
    slots = prepared.outputs
    shown = collections.Counter(slot.index for slot in slots if slot.kind == "program" or (
        slot.kind == "view" and slot.value.get("of") == "program"))
    candidates = {}
    for graph_input, graph_output in mutated_inputs:
        p = position.get(graph_input)
        if p is None or graph_output >= len(slots):
            continue
        slot = slots[graph_output]
        if slot.kind != "program" or shown[slot.index] != 1:
            continue
        before = placeholders[p].meta.get("val")
        after = results[slot.index].meta.get("val")
        if not (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor)):
            continue
        if before.device.type not in DONOR_DEVICES or before.dtype != after.dtype or \
                tuple(before.shape) != tuple(after.shape) or \
                not all(isinstance(n, int) for n in before.shape):
            continue
        candidates[graph_input] = (p, slot.index, graph_output)
    return candidates


class DonatingProgram:
    """A ``Program`` per donation set of one graph, called as a ``Program`` is (module doc).

    ``program``: the program donating every candidate; ``compile(donate)``: a program of the
    same graph donating ``donate`` ({program argument: program result}).
    """

    def __init__(self, program, candidates: dict, compile):
        self.base = program
        self.candidates = candidates
        self._compile = compile
        self._programs = {frozenset(candidates): program}
        self._order = sorted(candidates)

    def __getattr__(self, name):  # what callers read of a Program (name, lowered, ...)
        return getattr(self.base, name)

    def __call__(self, args: list, device: str | None = None) -> list:
        chosen = []
        by_type: dict = {}
        for i in self._order:
            by_type.setdefault(type(args[i]), []).append(i)
        refused = 0
        for cls, indices in by_type.items():
            donor = DONORS.get(cls)
            if donor is None:  # host tensors: never donated
                continue
            private = donor[0]([args[i] for i in indices], args)
            for i, ok in zip(indices, private):
                if ok:
                    chosen.append(i)
                else:
                    refused += 1
        donating = frozenset(chosen)
        program = self._programs.get(donating)
        if program is None:
            donating, program = self._program_for(donating)
        outputs = program(args, device)
        if donating:
            nbytes = 0
            for i in donating:
                tensor = args[i]
                graph_output = self.candidates[i][2]
                DONORS[type(tensor)][1](tensor, outputs[graph_output])
                # The input is its new value now: aot_autograd's copy_ of it is a no-op.
                outputs[graph_output] = tensor
                nbytes += tensor.numel() * tensor.element_size()
            COUNTERS.add("donated_inputs", len(donating))
            COUNTERS.add("donated_bytes", nbytes)
        if refused or len(donating) < len(chosen):
            COUNTERS.add("not_donated_shared", refused + len(chosen) - len(donating))
        return outputs

    def _program_for(self, donating: frozenset) -> tuple:
        """(the donation set run, its program) for inputs ``donating`` that may be donated."""
        if len(self._programs) >= MAX_DONATION_SETS:
            fits = [known for known in self._programs if known <= donating]
            if fits:
                best = max(fits, key=len)
                return best, self._programs[best]
            donating = frozenset()
        program = self._compile({self.candidates[i][0]: self.candidates[i][1]
                                 for i in donating})
        self._programs[donating] = program
        return donating, program


def host_adoptions(program, mutated_inputs) -> tuple:
    """(argument, result) pairs for ``Program.adopt_inputs``: each mutated input
    (``mutated_inputs``: (graph input, graph output) pairs) whose new value is a program result
    that no other output shows. At run time a host input then takes its result's memory
    (``transfer.adopt``) instead of aot_autograd copying the whole new value into it.

    Example::

        program.adopt_inputs(host_adoptions(program, ((2, 0),)))     # ((2, 0),) or ()
    """
    slots = program.slots
    if not mutated_inputs or program.executable is None:
        return ()
    if slots is None:
        return tuple(mutated_inputs)
    shown = collections.Counter(slot.index for slot in slots if slot.kind == "program" or (
        slot.kind == "view" and slot.value.get("of") == "program"))
    return tuple((graph_input, slots[graph_output].index)
                 for graph_input, graph_output in mutated_inputs
                 if graph_output < len(slots) and slots[graph_output].kind == "program"
                 and shown[slots[graph_output].index] == 1)
