"""Random ops drawn inside the program (``lower/device_random.py``, ``config.random_draws``):
dropout, ``rand_like``, ``randn_like`` and ``bernoulli`` follow eager's distribution and
``torch.manual_seed``, and the host uploads a key per draw instead of a mask; with "host"
(the CPU client's default), masks are drawn on the host from torch's generator.
"""
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torchtpu_compile
from tests.support.helpers import compile_tpu
from torchtpu_compile import config
from torchtpu_compile.lower.calling_convention import prepare
from torchtpu_compile.lower.decompositions import decomposition_table


def _dropout_mlp(x, w):
    return torch.nn.functional.dropout(torch.relu(x @ w), 0.25, training=True)


def test_the_host_draws_a_key_per_random_op_not_a_mask():
    x = torch.randn(64, 32)
    gm = make_fx(lambda x: (torch.ops.aten.native_dropout(x, 0.5, True)[0], torch.randn_like(x)),
                 decomposition_table=decomposition_table(), tracing_mode="fake")(x)
    with config.patch(random_draws="device"):
        prepared = prepare(gm)
    targets = {str(n.target) for n in prepared.gm.graph.nodes if n.op == "call_function"}
    assert not any("rand" in t or "bernoulli" in t for t in targets), targets
    (draw,) = prepared.random_inputs
    keys = draw()
    assert keys.dtype == torch.int32 and keys.shape == (2, 2)   # 16 bytes, not 2 masks
    with config.patch(random_draws="host"):
        assert len(prepare(gm).random_inputs) == 2
    assert len(prepare(gm, platform="cpu").random_inputs) == 2     # auto
    assert len(prepare(gm, platform="tpu").random_inputs) == 1


def test_distributions_seed_and_gradient_match_eager_semantics():
    def draws(x):
        return (torch.nn.functional.dropout(x, 0.3, True), torch.randn_like(x),
                torch.bernoulli(x, 0.2), torch.rand_like(x))
    compiled = compile_tpu(draws)
    x = torch.ones(40000)
    with config.patch(random_draws="device"):
        torch.manual_seed(3)
        first = compiled(x)
        torch.manual_seed(3)
        again = compiled(x)
        after = compiled(x)
    for a, b, c in zip(first, again, after):
        assert torch.equal(a, b), "same seed, same numbers"
        assert not torch.equal(b, c), "the generator advances between calls"
    dropped, normal, coin, uniform = first
    assert abs((dropped != 0).float().mean().item() - 0.7) < 0.015
    torch.testing.assert_close(dropped[dropped != 0], torch.full_like(dropped[dropped != 0],
                                                                      1 / 0.7))
    assert abs(normal.mean().item()) < 0.03 and abs(normal.std().item() - 1) < 0.03
    assert set(coin.unique().tolist()) <= {0.0, 1.0} and abs(coin.mean().item() - 0.2) < 0.015
    assert uniform.min() >= 0 and uniform.max() < 1 and abs(uniform.mean().item() - 0.5) < 0.01
    # the draws are independent of each other
    assert not torch.equal(dropped != 0, uniform < 0.7)

    # backward drops the gradient where the forward dropped the value
    x, w = torch.randn(16, 8), torch.randn(8, 8, requires_grad=True)
    with config.patch(matmul_precision="highest", random_draws="device"):
        out = compile_tpu(_dropout_mlp)(x, w)
        out.sum().backward()
    kept = (out != 0).float() / 0.75
    torch.testing.assert_close(w.grad, x.t() @ (kept * (x @ w.detach() > 0)), rtol=1e-5,
                               atol=1e-5)


def test_off_draws_the_mask_on_the_host_from_torchs_generator():
    x, w = torch.randn(16, 8), torch.randn(8, 8)
    with config.patch(random_draws="host", matmul_precision="highest"):
        torch.manual_seed(5)
        got = compile_tpu(_dropout_mlp)(x, w)
    torch.manual_seed(5)
    keep = torch.rand(16, 8) < 0.75
    torch.testing.assert_close(got, torch.relu(x @ w) * keep / 0.75, rtol=1e-6, atol=1e-6)
    assert torchtpu_compile.stats()["fallback_ops"] == {}


def test_eager_device_dropout_draws_on_the_device_from_the_tpu_generator():
    import torchtpu_eager  # noqa: F401  (the tpu device)
    x = torch.ones(20000, device="tpu", requires_grad=True)
    with config.patch(random_draws="device"):
        torch.tpu.manual_seed(3)
        a = torch.nn.functional.dropout(x, 0.3)
        torch.tpu.manual_seed(3)
        b = torch.nn.functional.dropout(x, 0.3)
        c = torch.nn.functional.dropout(x, 0.3)
    assert torch.equal(a.cpu(), b.cpu()) and not torch.equal(b.cpu(), c.cpu())
    a = a.cpu()
    assert abs((a != 0).float().mean().item() - 0.7) < 0.02
    torch.testing.assert_close(a[a != 0], torch.full_like(a[a != 0], 1 / 0.7))
    b.sum().backward()
    assert torch.equal(x.grad.cpu() != 0, b.detach().cpu() != 0)


def test_a_random_op_in_a_region_cut_around_a_fallback_compiles(fresh_dynamo):
    # Sampling a Bernoulli and a Beta in one compiled function (RL exploration): the Beta's
    # _sample_dirichlet falls back, and the region after it declared the fallback's result
    # as an input after the bernoulli; the draw's input went after that one, behind its user,
    # and the backend raised "Argument 'random_0' of Node 'lt' was used before it has been
    # defined!".
    def sample(c):
        return torch.bernoulli(c[:, 0] * 0.3), torch._sample_dirichlet(c)[:, 0] * 2

    for draws in ("host", "device"):
        torch._dynamo.reset()
        with config.patch(random_draws=draws):
            coin, beta = compile_tpu(sample)(torch.ones(500, 3))
        assert set(coin.unique().tolist()) == {0.0, 1.0}
        assert 0.15 < coin.mean().item() < 0.45, coin.mean()
        assert ((beta > 0) & (beta < 2)).all() and 0.5 < beta.mean().item() < 0.85
    # one op falls back, counted once per program built: a frame served warm builds its
    # program once (an entry refused after loading its graph built it twice)
    assert torchtpu_compile.stats()["fallback_ops"] == {"aten._sample_dirichlet.default": 2}
