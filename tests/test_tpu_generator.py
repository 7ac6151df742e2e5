"""``torch.Generator(device="tpu")`` (csrc/native.cpp, torchtpu_eager/rng.py) against CPU
generators: a seed gives CPU's numbers and draws advance as CPU's do, states round-trip between
the two, and what CUDA refuses (a generator of another device) is refused the same way.
"""
import copy
import pickle

import pytest
import torch
import torch.nn as nn

import torchtpu_eager  # noqa: F401  (registers the device; autoload does too)

TPU = torch.device("tpu", 0)

# name -> draw(generator, device): each draws with generator= on that device.
DRAWS = {
    "randn": lambda g, d: torch.randn(3, 4, device=d, generator=g),
    "rand": lambda g, d: torch.rand(5, device=d, generator=g),
    "randint": lambda g, d: torch.randint(0, 10, (6,), device=d, generator=g),
    "randperm": lambda g, d: torch.randperm(10, device=d, generator=g),
    "normal_": lambda g, d: torch.empty(4, device=d).normal_(1, 2, generator=g),
    "normal": lambda g, d: torch.normal(torch.zeros(3, device=d), torch.ones(3, device=d),
                                        generator=g),
    "uniform_": lambda g, d: torch.empty(4, device=d).uniform_(-1, 1, generator=g),
    "random_": lambda g, d: torch.empty(4, device=d).random_(0, 5, generator=g),
    "exponential_": lambda g, d: torch.empty(4, device=d).exponential_(generator=g),
    "bernoulli": lambda g, d: torch.bernoulli(torch.full((8,), 0.3, device=d), generator=g),
    "bernoulli_": lambda g, d: torch.empty(8, device=d).bernoulli_(0.3, generator=g),
    "multinomial": lambda g, d: torch.multinomial(torch.tensor([.1, .2, .7], device=d), 5, True,
                                                  generator=g),
    "poisson": lambda g, d: torch.poisson(torch.full((4,), 3.0, device=d), generator=g),
    "init.kaiming_uniform_": lambda g, d: nn.init.kaiming_uniform_(torch.empty(3, 4, device=d),
                                                                   generator=g),
    "init.trunc_normal_": lambda g, d: nn.init.trunc_normal_(torch.empty(3, 4, device=d),
                                                             generator=g),
    "init.xavier_normal_": lambda g, d: nn.init.xavier_normal_(torch.empty(3, 4, device=d),
                                                               generator=g),
    "init.orthogonal_": lambda g, d: nn.init.orthogonal_(torch.empty(3, 4, device=d),
                                                         generator=g),
}


def _generators(seed=0):
    return torch.Generator("tpu").manual_seed(seed), torch.Generator().manual_seed(seed)


def test_a_tpu_generator_is_on_tpu0_with_cpus_default_seed():
    tpu, cpu = torch.Generator("tpu"), torch.Generator()
    assert tpu.device == TPU and torch.Generator(device=TPU).device == TPU
    assert tpu.initial_seed() == cpu.initial_seed()
    assert torch.equal(tpu.get_state(), cpu.get_state())


@pytest.mark.parametrize("name", list(DRAWS))
def test_draws_equal_a_cpu_generators_with_the_same_seed(name):
    tpu, cpu = _generators(0)
    draw = DRAWS[name]
    for _ in range(2):   # the second draw checks the state advanced as CPU's does
        got, expected = draw(tpu, "tpu"), draw(cpu, "cpu")
        assert got.device == TPU
        # orthogonal_ runs a QR after the draw: its float rounding may differ, not its draw
        exact = name != "init.orthogonal_"
        torch.testing.assert_close(got.cpu(), expected, rtol=0 if exact else 1e-5,
                                   atol=0 if exact else 1e-6)
    assert torch.equal(tpu.get_state(), cpu.get_state())


#: views written in place by a draw: eager draws in an order (and, for normal_ from 16
#: elements, by a method) that follows the view's strides.
VIEWS = {"t": lambda b: b.t(), "narrow": lambda b: b.narrow(1, 1, 2), "step": lambda b: b[::2],
         "column": lambda b: b[:, 1]}
IN_PLACE_DRAWS = {
    "normal_": lambda v: v.normal_(), "uniform_": lambda v: v.uniform_(),
    "bernoulli_": lambda v: v.bernoulli_(0.5),
    "bernoulli_tensor": lambda v: v.bernoulli_(torch.full(v.shape, 0.5, device=v.device)),
    "random_": lambda v: v.random_(0, 100), "exponential_": lambda v: v.exponential_(),
    "trunc_normal_": lambda v: nn.init.trunc_normal_(v),
}


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("draw", list(IN_PLACE_DRAWS))
def test_in_place_draws_into_views_equal_cpus(view, draw):
    # They ran on a contiguous host copy, so a transposed or narrowed view got CPU's numbers
    # for a contiguous tensor (nn.init.normal_(w.data.t()) differed by up to 3.8).
    got, expected = [], []
    for device, out in (("tpu", got), ("cpu", expected)):
        torch.manual_seed(0)
        base = torch.zeros(24, 4, device=device)
        IN_PLACE_DRAWS[draw](VIEWS[view](base))
        out.append(base.cpu())
    assert torch.equal(got[0], expected[0])


def test_diffusers_style_seeded_latents():
    # diffusers: torch.Generator(device).manual_seed(0), passed to randn for the latents
    latents = torch.randn(1, 4, 8, 8, device="tpu", dtype=torch.float16,
                          generator=torch.Generator("tpu").manual_seed(0))
    expected = torch.randn(1, 4, 8, 8, dtype=torch.float16,
                           generator=torch.Generator().manual_seed(0))
    assert torch.equal(latents.cpu(), expected)


def test_state_round_trips_with_cpu_generators():
    tpu, cpu = _generators(5)
    torch.rand(7, device="tpu", generator=tpu)
    saved = tpu.get_state()
    first = torch.randn(4, device="tpu", generator=tpu).cpu()
    cpu.set_state(saved)   # a tpu state drives a CPU generator ...
    assert torch.equal(torch.randn(4, generator=cpu), first)
    tpu.set_state(saved)   # ... and a tpu one, again
    assert torch.equal(torch.randn(4, device="tpu", generator=tpu).cpu(), first)
    other = torch.Generator().manual_seed(9)
    tpu.set_state(other.get_state())   # a CPU state drives a tpu generator
    assert torch.equal(torch.rand(3, device="tpu", generator=tpu).cpu(),
                       torch.rand(3, generator=other))


@pytest.mark.parametrize("copier", [
    lambda g: g.clone_state(), copy.deepcopy, lambda g: pickle.loads(pickle.dumps(g))])
def test_copies_are_tpu_generators_with_the_same_state(copier):
    tpu = torch.Generator("tpu").manual_seed(11)
    torch.rand(3, device="tpu", generator=tpu)
    twin = copier(tpu)
    assert twin.device == TPU and twin.initial_seed() == 11
    assert torch.equal(torch.rand(5, device="tpu", generator=twin).cpu(),
                       torch.rand(5, device="tpu", generator=tpu).cpu())


def test_seed_and_initial_seed_as_cpus():
    tpu, cpu = _generators(0)
    assert tpu.initial_seed() == 0
    seed = tpu.seed()
    assert tpu.initial_seed() == seed
    cpu.manual_seed(seed)
    assert torch.equal(tpu.get_state(), cpu.get_state())
    with pytest.raises(RuntimeError, match="does not use offset"):
        torch.Generator().set_offset(3)   # CPU's refusal ...
    with pytest.raises(RuntimeError, match="does not use offset"):
        tpu.set_offset(3)                 # ... is the tpu generator's


def test_a_separate_generator_leaves_the_default_generators_alone():
    torch.tpu.manual_seed(123)
    tpu_default, cpu_default = torch.tpu.get_rng_state(), torch.random.get_rng_state()
    g = torch.Generator("tpu").manual_seed(0)
    torch.randn(10, device="tpu", generator=g)
    torch.empty(4, device="tpu").uniform_(generator=g)
    assert torch.equal(torch.tpu.get_rng_state(), tpu_default)
    assert torch.equal(torch.random.get_rng_state(), cpu_default)
    torch.tpu.manual_seed(123)
    expected = torch.rand(3, device="tpu").cpu()
    torch.tpu.manual_seed(123)
    torch.rand(3, device="tpu", generator=g)
    assert torch.equal(torch.rand(3, device="tpu").cpu(), expected)


@pytest.mark.parametrize("draw", [
    lambda g: torch.randn(3, generator=g),
    lambda g: torch.empty(3).normal_(generator=g),
    lambda g: torch.multinomial(torch.ones(3), 2, generator=g),
    lambda g: torch.normal(torch.zeros(3), torch.ones(3), generator=g),
])
def test_a_cpu_op_refuses_a_tpu_generator_as_it_refuses_a_cuda_one(draw):
    # CPU's own check, message and type: "Expected a 'cpu' device type for generator but
    # found 'cuda'" for a CUDA generator
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but "
                                           "found 'tpu'"):
        draw(torch.Generator("tpu"))


@pytest.mark.parametrize("draw", [
    lambda g: torch.randn(3, device="tpu", generator=g),
    lambda g: torch.empty(3, device="tpu").normal_(generator=g),
    lambda g: torch.bernoulli(torch.full((3,), 0.5, device="tpu"), generator=g),
    lambda g: torch.randperm(5, device="tpu", generator=g),
])
def test_a_tpu_op_refuses_a_cpu_generator_as_cuda_ops_do(draw):
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but "
                                           "found 'cpu'"):
        draw(torch.Generator())


def test_a_generator_on_a_device_that_does_not_exist_is_refused():
    with pytest.raises(RuntimeError, match="tpu:1 does not exist"):
        torch.Generator("tpu:1")


def test_compiled_functions_draw_as_eager_from_a_tpu_generator():
    def draws(x, g):
        return x + torch.randn(x.shape, device=x.device, generator=g), torch.rand(
            2, device=x.device, generator=g)
    compiled = torch.compile(draws, backend="torchtpu")
    x = torch.ones(3, device="tpu")
    g_compiled, g_eager = torch.Generator("tpu").manual_seed(0), torch.Generator(
        "tpu").manual_seed(0)
    for _ in range(2):
        for got, expected in zip(compiled(x, g_compiled), draws(x, g_eager)):
            assert torch.equal(got.cpu(), expected.cpu())
    assert torch.equal(g_compiled.get_state(), g_eager.get_state())


def test_a_compiled_cpu_function_refuses_a_tpu_generator_as_eager():
    def draw(x, g):
        return x + torch.randn(3, generator=g)
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator"):
        torch.compile(draw, backend="torchtpu")(torch.ones(3), torch.Generator("tpu"))


def test_tpu_draws_in_one_thread_leave_another_threads_cpu_draws_alone():
    # Each tpu draw swapped its generator's state into torch's default CPU generator: a thread
    # drawing on the CPU meanwhile (a prefetcher's augmentations) took tpu-stream numbers, and
    # 299 of 300 of its draws differed from the same draws made alone.
    import threading

    def cpu_draws():
        return [torch.randn(64) for _ in range(300)]

    def tpu_draws():
        return [torch.randn(64, device="tpu").cpu() for _ in range(300)]

    torch.manual_seed(0)
    torch.tpu.manual_seed(1)
    alone = cpu_draws(), tpu_draws()
    torch.manual_seed(0)
    torch.tpu.manual_seed(1)
    out = {}
    threads = [threading.Thread(target=lambda: out.__setitem__("tpu", tpu_draws())),
               threading.Thread(target=lambda: out.__setitem__("cpu", cpu_draws()))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for together, by_itself in zip((out["cpu"], out["tpu"]), alone):
        assert all(torch.equal(a, b) for a, b in zip(together, by_itself))


def test_compiled_draws_on_tpu_tensors_come_from_the_tpu_generator(fresh_dynamo):
    # A compiled graph on tpu tensors drew from the CPU generator: torch.tpu.manual_seed did
    # not change its masks, and eager tpu draws after the call repeated its numbers.
    def noisy(x):
        keep = torch.rand(x.shape, device=x.device) < 0.5
        return x * keep + torch.randn(x.shape, device=x.device)

    compiled = torch.compile(noisy, backend="torchtpu")
    x = torch.ones(16, device="tpu")
    compiled(x)
    cpu_state = torch.get_rng_state()
    for seed in (0, 1):
        torch.tpu.manual_seed(seed)
        got, after = compiled(x), torch.randn(4, device="tpu")
        torch.tpu.manual_seed(seed)
        want, want_after = noisy(x), torch.randn(4, device="tpu")
        assert torch.equal(got.cpu(), want.cpu())
        assert torch.equal(after.cpu(), want_after.cpu())
    assert torch.equal(torch.get_rng_state(), cpu_state)


def test_compiled_checkpointed_dropout_on_tpu_tensors_follows_the_tpu_seed(fresh_dynamo):
    # aot_autograd's rng-state nodes (a dropout recomputed in a checkpointed block) carry no
    # value to tell their device: they drew from the CPU generator on tpu tensors.
    from torch.utils.checkpoint import checkpoint

    def f(x):
        y = checkpoint(lambda t: torch.nn.functional.dropout(t * 1.0, 0.5), x,
                       use_reentrant=False)
        return y, y.sum()

    compiled = torch.compile(f, backend="torchtpu")
    x = (torch.rand(64) + 1).to("tpu").requires_grad_()
    runs = []
    for cpu_seed in (0, 1):
        torch.manual_seed(cpu_seed)
        torch.tpu.manual_seed(3)
        y, total = compiled(x)
        total.backward()
        runs.append((y.detach().cpu(), x.grad.cpu()))
        x.grad = None
    assert torch.equal(runs[0][0], runs[1][0])
    for y, grad in runs:  # the backward's mask is the forward's
        assert torch.equal(y != 0, grad != 0)
