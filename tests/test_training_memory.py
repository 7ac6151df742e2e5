"""Memory of a compiled training step: what stays live, and the step's values.

A whole training step under ``torch.compile`` (forward, ``backward()``, the optimizer's step
and ``zero_grad``) on host tensors. The memory reference is PJRT's own list of live buffers
(``live_arrays``), and the sizes of the model's parameters and optimizer state; the values'
reference is the same step in eager CPU PyTorch.
"""
import copy
import gc
import time

import pytest
import torch

from torchtpu_compile import config
from torchtpu_compile.runtime import memory
from torchtpu_compile.runtime.client import get_client


def _live_buffer_bytes() -> int:
    # By address: jaxlib can wrap one buffer in several arrays (zero-copy uploads of one tensor)
    device = get_client().device
    return sum({a.unsafe_buffer_pointer(): a.nbytes for a in get_client().pjrt.live_arrays()
                if device in a.sharding.device_set}.values())


def _allocated_once_settled(before: int, expected: int) -> int:
    """memory_allocated()'s figure over ``before``, once it is ``expected`` or 5 s passed.

    PJRT ends a program's hold on its zero-copy inputs on its own thread, just after the
    results are ready; the host tensor such an input viewed is released from there, which can
    land after the step returned (on a loaded machine, tens of ms). The figure is read again
    until then: without the fix nothing frees the dead results while gc is off, and it never
    settles."""
    deadline = time.monotonic() + 5
    while True:
        allocated = memory.snapshot()["allocated_bytes"] - before
        if allocated == expected or time.monotonic() > deadline:
            return allocated
        time.sleep(0.01)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                               torch.nn.Linear(512, 256))


OPTIMIZERS = {
    # eps well above the gradients' rounding: Adam's first update is lr * g / (|g| + eps), so
    # with the default 1e-8 a gradient near zero turns a last-bit difference of the matmuls'
    # summation order (XLA's and eager's) into a difference of the update's size.
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, eps=1e-3),
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
}


def _trainer(model, optimizer, compiled: bool):
    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss
    return torch.compile(step, backend="torchtpu") if compiled else step


def _state_bytes(model, optimizer) -> int:
    """Bytes of what a step must keep: parameters and every tensor of the optimizer state."""
    tensors = list(model.parameters()) + [v for state in optimizer.state.values()
                                          for v in state.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_after_a_compiled_step_only_the_training_state_is_live(name, fresh_dynamo):
    """The gradients, the parameters' new values (copied back into them) and the moments' old
    memory die with the step. jaxlib queued their release until Python's next garbage
    collection, which nothing in a training loop triggers in time: with the collector off,
    they were all still live after every step (5 x the parameters for AdamW)."""
    gc.collect()  # what earlier tests left
    before, live_before = memory.snapshot()["allocated_bytes"], _live_buffer_bytes()
    model = _model()
    optimizer = OPTIMIZERS[name](model.parameters())
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    with config.patch(matmul_precision="highest"):
        step = _trainer(model, optimizer, compiled=True)
        step(x, y)
        gc.collect()
        gc.disable()  # no collection may free them for us
        try:
            for _ in range(3):
                step(x, y)
                # memory_allocated()'s figure, and PJRT's own list of live buffers
                allocated = _allocated_once_settled(before, _state_bytes(model, optimizer))
                assert allocated == _state_bytes(model, optimizer)
                assert _live_buffer_bytes() - live_before == allocated
        finally:
            gc.enable()


def _said(where: str):
    """assert_close's message with ``where`` in front (its own would be replaced)."""
    return lambda message: f"{where}: {message}"


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_compiled_steps_match_eager(name, fresh_dynamo):
    """Three whole compiled steps, then three more after Dynamo forgot them (the graph cache
    serves the second compile): the losses and parameters of eager CPU PyTorch."""
    model = _model()
    reference = copy.deepcopy(model)
    optimizer = OPTIMIZERS[name](model.parameters())
    expected_optimizer = OPTIMIZERS[name](reference.parameters())
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    expected_step = _trainer(reference, expected_optimizer, compiled=False)
    with config.patch(matmul_precision="highest"):
        for round_ in ("cold", "warm"):
            step = _trainer(model, optimizer, compiled=True)
            for i in range(3):
                got, want = step(x, y), expected_step(x, y)
                where = f"{round_} step {i}"
                torch.testing.assert_close(got, want, msg=_said(f"{where}: loss"))
                for (what, p), q in zip(model.named_parameters(), reference.parameters()):
                    torch.testing.assert_close(p, q, msg=_said(f"{where}: {what}"))
            torch._dynamo.reset()


def test_a_language_models_loss_backward_holds_one_logits_sized_buffer(fresh_dynamo,
                                                                       monkeypatch):
    """A language model head's backward: cross entropy over (tokens x vocabulary) logits,
    then the head's two matmuls. Its XLA program needs one logits-sized temporary (their
    gradient, which both matmuls read). It held two: nll_loss's one-hot, a scatter, then on
    the CPU client a select that XLA CPU's library reduction fusion wrote out whole before
    reducing it (200 MB a step of GPT-2's 4 x 256 batch). The values are eager's."""
    from torchtpu_compile.runtime.executable import Executable

    tokens, width, vocabulary = 256, 64, 4096
    logits_bytes = tokens * vocabulary * 4
    torch.manual_seed(0)
    hidden, head = torch.randn(tokens, width), torch.randn(vocabulary, width) * 0.1
    target = torch.randint(0, vocabulary, (tokens,))
    target[::7] = -100  # ignored positions, as a padded batch's labels

    def loss_of(hidden, head):
        return torch.nn.functional.cross_entropy(hidden @ head.t(), target)

    temporaries = {}
    run = Executable.run

    def recorded(self, buffers):
        stats = self.loaded.get_compiled_memory_stats()
        temporaries[self.name] = stats.temp_size_in_bytes
        return run(self, buffers)

    monkeypatch.setattr(Executable, "run", recorded)
    grads = []
    with config.patch(matmul_precision="highest"):
        for compute in (torch.compile(loss_of, backend="torchtpu"), loss_of):
            h, w = hidden.clone().requires_grad_(), head.clone().requires_grad_()
            compute(h, w).backward()
            grads.append((h.grad, w.grad))
    torch.testing.assert_close(grads[0], grads[1])
    [backward] = [name for name in temporaries if "backward" in name]
    assert temporaries[backward] < 1.5 * logits_bytes, (temporaries, logits_bytes)


class _SmallLanguageModel(torch.nn.Module):
    """An embedding, two MLP blocks and an untied head over a large vocabulary: the logits
    (tokens x vocabulary) dwarf every other activation, as in a real language model."""

    def __init__(self, vocabulary: int, width: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocabulary, width)
        self.blocks = torch.nn.Sequential(*[torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))
            for _ in range(2)])
        self.head = torch.nn.Linear(width, vocabulary, bias=False)

    def forward(self, ids, labels):
        logits = self.head(self.blocks(self.embed(ids)))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def test_a_backward_lets_the_saved_logits_die_before_the_rest_of_it_runs(fresh_dynamo,
                                                                        monkeypatch):
    """An XLA program holds its inputs until it returns. A language model's backward, as one
    program, held the saved logits and their gradient while the rest of the backward made
    every other gradient. Cut into pieces (program/memory_split.py), the logits die once
    their gradient is made, and that gradient once the head's matmuls have read it: the
    backward's peak of live memory (what was live when each of its programs started, plus
    the program's results and temporaries, XLA's own figures) stays within one logits-sized
    buffer of what was live when it began. The gradients are eager's. (On by default on
    accelerators; the CPU client runs it when told to, config.split_backward.)"""
    from torchtpu_compile.runtime.executable import Executable

    tokens, width, vocabulary = 2 * 256, 256, 16384
    logits_bytes = tokens * vocabulary * 4
    torch.manual_seed(0)
    ids = torch.randint(0, vocabulary, (2, 256))
    labels = torch.randint(0, vocabulary, (2, 256))
    labels[:, ::5] = -100
    peaks = []
    run = Executable.run

    def recorded(self, buffers):
        if "backward" in self.name:
            stats = self.loaded.get_compiled_memory_stats()
            peaks.append(memory.snapshot()["allocated_bytes"] + stats.output_size_in_bytes
                         + stats.temp_size_in_bytes)
        return run(self, buffers)

    monkeypatch.setattr(Executable, "run", recorded)
    model = _SmallLanguageModel(vocabulary, width)
    grads = []
    with config.patch(matmul_precision="highest", split_backward="on"):
        for compiled in (True, False):
            trained = copy.deepcopy(model)
            loss_of = torch.compile(trained, backend="torchtpu") if compiled else trained
            loss = loss_of(ids, labels)
            if compiled:
                start = memory.snapshot()["allocated_bytes"]
            loss.backward()
            grads.append([p.grad for p in trained.parameters()])
    torch.testing.assert_close(grads[0], grads[1])
    assert len(peaks) > 1, "the backward ran as one program"
    assert max(peaks) - start < 1.25 * logits_bytes, (
        [round((p - start) / logits_bytes, 2) for p in peaks])


def test_a_backward_in_pieces_runs_again_through_a_retained_graph(fresh_dynamo):
    """The pieces' code empties the argument list aot_autograd hands a backward, so that the
    saved values die between pieces. Under ``backward(retain_graph=True)`` the graph keeps
    them: a second backward through it (gradient accumulation over one graph, a GAN's two
    losses) gets them again, and both give eager's gradients."""
    import torchtpu_compile

    torch.manual_seed(0)
    ids = torch.randint(0, 16384, (2, 256))
    labels = torch.randint(0, 16384, (2, 256))
    model = _SmallLanguageModel(16384, 256)
    grads = []
    with config.patch(matmul_precision="highest", split_backward="on"):
        before = torchtpu_compile.stats()["graphs_cut_for_memory"]
        for compiled in (True, False):
            trained = copy.deepcopy(model)
            loss_of = torch.compile(trained, backend="torchtpu") if compiled else trained
            loss = loss_of(ids, labels)
            loss.backward(retain_graph=True)
            first = [p.grad.clone() for p in trained.parameters()]
            (2 * loss).backward()
            grads.append((first, [p.grad for p in trained.parameters()]))
        assert torchtpu_compile.stats()["graphs_cut_for_memory"] > before
    for got, expected in zip(grads[0], grads[1]):
        torch.testing.assert_close(got, expected)
