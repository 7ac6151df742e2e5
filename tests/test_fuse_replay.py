"""A defer-and-fuse training step repeated: recorded op by op, its fused program compiled once
and then taken from the cache, and every step's values eager CPU PyTorch's, also after the
parameters, the learning rate or the batch shape change."""

import pytest
import torch

import torchtpu_compile
import torchtpu_eager  # noqa: F401  (registers the device)
from torchtpu_compile import profiling

TPU = torch.device("tpu", 0)


pytestmark = pytest.mark.usefixtures("defer_and_fuse")   # tests/conftest.py


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))


def _step(model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


class _Pair:
    """The same model and SGD optimizer on the host (eager CPU, the reference) and on tpu."""

    def __init__(self, lr=0.05):
        self.cpu = _mlp()
        self.tpu = _mlp().to(TPU)
        self.opt_cpu = torch.optim.SGD(self.cpu.parameters(), lr=lr, momentum=0.9)
        self.opt_tpu = torch.optim.SGD(self.tpu.parameters(), lr=lr, momentum=0.9)

    def step(self, x, y):
        expected = _step(self.cpu, self.opt_cpu, x, y)
        got = _step(self.tpu, self.opt_tpu, x.to(TPU), y.to(TPU))
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)
        for p, q in zip(self.cpu.parameters(), self.tpu.parameters()):
            torch.testing.assert_close(q.cpu(), p, rtol=1e-5, atol=1e-6)


def _batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 16, generator=g), torch.randint(0, 5, (n,), generator=g)


def test_a_repeated_step_compiles_nothing_new_and_gives_eagers_values():
    pair = _Pair()
    for seed in range(3):
        pair.step(*_batch(8, seed))
    before = torchtpu_compile.stats()
    for seed in range(3, 8):
        pair.step(*_batch(8, seed))  # new data each step: the program is replayed on it
    after = torchtpu_compile.stats()
    assert after["eager_programs_compiled"] == before["eager_programs_compiled"]
    runs = after["fused_graphs_run"] - before["fused_graphs_run"]
    assert after["fused_graph_cache_hits"] - before["fused_graph_cache_hits"] == runs > 0


def test_a_replayed_step_after_the_parameters_change():
    pair = _Pair()
    x, y = _batch(8, 0)
    for _ in range(3):
        pair.step(x, y)
    with torch.no_grad():  # written outside the step, on both sides alike
        for p, q in zip(pair.cpu.parameters(), pair.tpu.parameters()):
            p.mul_(0.5)
            q.mul_(0.5)
        pair.cpu[0].weight.data = pair.cpu[0].weight.data + 1
        pair.tpu[0].weight.data = pair.tpu[0].weight.data + 1
    for _ in range(3):
        pair.step(x, y)


def test_a_replayed_step_after_the_learning_rate_changes():
    pair = _Pair()
    x, y = _batch(8, 0)
    for lr in (0.05, 0.05, 0.2, 0.2, 0.01, 0.3):
        for opt in (pair.opt_cpu, pair.opt_tpu):
            opt.param_groups[0]["lr"] = lr
        pair.step(x, y)


def test_a_replayed_step_after_the_batch_shape_changes():
    pair = _Pair()
    for n in (8, 8, 3, 3, 8, 1):
        pair.step(*_batch(n, n))


def test_dense_and_strided_ops_mixed_in_one_recording_match_eager():
    # Dense inputs, a host scalar tensor, a strided view, a value of an earlier recording and
    # an in-place write through a view, in one recording.
    torch.manual_seed(0)
    a, b = torch.randn(4, 6), torch.randn(6, 4)
    x, w = a.to(TPU), b.to(TPU)
    earlier = (x * 2).cpu()  # a flush: x * 2's recording ran
    r = x * 3
    s = r + torch.tensor(1.5)              # a 0-dim host tensor: uploaded
    t = s + w.t()                          # a strided read folded in
    t.add_(x)                              # in place, dense
    t[:, 1].mul_(2)                        # in place through a view
    u = t.relu()
    expected = (a * 3 + 1.5 + b.t() + a)
    expected[:, 1] *= 2
    torch.testing.assert_close(earlier, a * 2)
    torch.testing.assert_close(u.cpu(), expected.relu())
    torch.testing.assert_close(t.cpu(), expected)


def test_a_stacked_model_still_cuts_at_its_repeated_block():
    # A repeated block of 8+ ops is cut (and reused).
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 8) for _ in range(6)]
    x_cpu = torch.randn(4, 8)

    def run(x, mods):
        for m in mods:
            x = torch.tanh(m(x)) * 1.5 + 0.1
            x = x - x.mean() + x.sigmoid() * 0.5
        return x

    expected = run(x_cpu, layers)
    mods = [torch.nn.Linear(8, 8).to(TPU) for _ in range(6)]
    for m, ref in zip(mods, layers):
        m.load_state_dict(ref.state_dict())
    before = torchtpu_compile.stats()["fused_graphs_run"]
    with torch.no_grad():
        got = run(x_cpu.to(TPU), mods).cpu()
    torch.testing.assert_close(got, expected.detach())
    assert torchtpu_compile.stats()["fused_graphs_run"] - before > 1


@pytest.mark.parametrize("mode", ["defer_and_fuse", "strict"])
def test_detach_shares_its_bases_storage(mode):
    torch.tpu.set_eager_mode(mode)
    a = torch.arange(12.0).reshape(3, 4)
    x = a.to(TPU)
    for base, ref in ((x, a), (x.t(), a.t()), (x[1:], a[1:])):
        d = base.detach()
        assert d.shape == ref.shape and d.stride() == ref.stride()
        assert d.storage_offset() == ref.storage_offset()
    d = x.t().detach()
    x.add_(1)
    torch.testing.assert_close(d.cpu(), (a + 1).t())
    with torch.inference_mode():
        assert not x.detach().is_inference()


def test_a_span_with_arguments_costs_nothing_with_the_profiler_off():
    # spanning(name, **args) made and entered a RecordFunction with the profiler off: every
    # defer-and-fuse run paid for one.
    assert not torch.autograd.profiler._is_profiler_enabled
    assert profiling.spanning("torchtpu::fused_graph", ops=3) is profiling.spanning("x")


def _programs_over(steps) -> int:
    before = torchtpu_compile.stats()["eager_programs_compiled"]
    for step in steps:
        step()
    return torchtpu_compile.stats()["eager_programs_compiled"] - before


def test_a_replay_batch_that_samples_the_same_tensor_twice_reuses_the_steps_program():
    # DQN's step: cat of 32 sampled states and of their next states, where a transition's next
    # state is the next transition's state and samples repeat. The recording listed a buffer
    # read twice as one input, so which inputs shared a buffer was part of the program's key,
    # a random pattern: a new program every step (the tutorial: 130 in 150 steps).
    import random
    torch.manual_seed(0)
    model_cpu = torch.nn.Linear(4, 2)
    model = torch.nn.Linear(4, 2).to(TPU)
    model.load_state_dict(model_cpu.state_dict())
    opt_cpu = torch.optim.SGD(model_cpu.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    states_cpu = [torch.randn(1, 4) for _ in range(12)]
    states = [s.to(TPU) for s in states_cpu]
    rng = random.Random(0)

    def step():
        picks = [rng.randrange(11) for _ in range(8)]   # with repeats
        losses = []
        for m, o, pool in ((model_cpu, opt_cpu, states_cpu), (model, opt, states)):
            state = torch.cat([pool[i] for i in picks])
            following = torch.cat([pool[i + 1] for i in picks])
            o.zero_grad()
            loss = (m(state) - m(following).detach()).pow(2).mean()
            loss.backward()
            o.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-5, abs=1e-6)

    _programs_over([step] * 2)
    assert _programs_over([step] * 6) == 0
    for p, q in zip(model_cpu.parameters(), model.parameters()):
        torch.testing.assert_close(q.cpu(), p, rtol=1e-5, atol=1e-6)


def test_a_batch_of_views_and_fresh_tensors_at_random_reuses_the_steps_program():
    # DQN's actions: each a view (argmax(...).view(1, 1)) or, at random, a fresh tensor, read
    # by .item(), then a sampled batch of them cat. Each view's reshape was folded into the
    # cat's program at its position in the batch: a program per pattern, hence per step.
    import random
    torch.manual_seed(0)
    q_cpu = torch.randn(16, 1, 3)
    q = q_cpu.to(TPU)
    rng = random.Random(0)
    actions_cpu, actions = [], []
    for i in range(16):
        if rng.random() < 0.5:
            pair = [t[i].argmax(1).view(1, 1) for t in (q_cpu, q)]
        else:
            k = rng.randrange(3)
            pair = [torch.tensor([[k]]), torch.tensor([[k]], device=TPU)]
        assert pair[1].item() == pair[0].item()
        actions_cpu.append(pair[0])
        actions.append(pair[1])
    values_cpu = torch.randn(8, 3)
    values = values_cpu.to(TPU)

    def step():
        picks = rng.sample(range(16), 8)
        expected = values_cpu.gather(1, torch.cat([actions_cpu[i] for i in picks])).sum()
        got = values.gather(1, torch.cat([actions[i] for i in picks])).sum()
        assert got.item() == pytest.approx(expected.item(), rel=1e-6)

    _programs_over([step] * 2)
    assert _programs_over([step] * 6) == 0
    for a, b in zip(actions_cpu, actions):
        assert b.shape == a.shape and b.stride() == a.stride() and torch.equal(b.cpu(), a)


def test_per_token_steps_over_sentences_of_other_lengths_reuse_their_programs():
    # seq2seq's loops: a step per token reads target[i] of a sentence already on the device.
    # Recorded, that read took the whole sentence as an input, so every block's program was
    # keyed by the sentence's length and compiled again for each new length.
    torch.manual_seed(0)
    w_cpu, table_cpu = torch.randn(8, 8) * 0.3, torch.randn(10, 8)
    w, table = w_cpu.to(TPU), table_cpu.to(TPU)
    g = torch.Generator().manual_seed(1)

    def sentence(length):
        target_cpu = torch.randint(0, 10, (length, 1), generator=g)
        target = target_cpu.to(TPU)

        def run(target, w, table):
            h = torch.zeros(1, 8, device=target.device)
            loss = 0
            for i in range(length):
                e = torch.index_select(table, 0, target[i])
                h = torch.tanh(h @ w + e) * 0.5 + h * 0.5
                loss = loss + h.sum()
            return loss.item()
        return lambda: run(target, w, table) == pytest.approx(
            run(target_cpu, w_cpu, table_cpu), rel=1e-5, abs=1e-5)

    assert all(step() for step in [sentence(5), sentence(5)])
    new_lengths = [sentence(n) for n in (6, 7, 8, 9)]
    results = []
    # A gather of one token per new length (a program of a few ops), no step's program.
    assert _programs_over([lambda step=step: results.append(step()) for step in new_lengths]) \
        <= len(new_lengths)
    assert all(results)
