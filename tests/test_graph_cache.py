"""The cache above the StableHLO: aot_autograd results and lowered StableHLO, across processes."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchtpu_compile
from tests.support.helpers import compile_tpu
from torchtpu_compile import config
from torchtpu_compile import dynamo_cache, graph_cache
from torchtpu_compile.lower import cache as lowering_cache
from torchtpu_compile.runtime import executable
from torchtpu_compile.runtime.cache import GRAPH_FOLDER, frame
from tests.support import python_env

# A model in a fresh process: inference under no_grad, one SGD training step, inference again;
# prints every output, the gradients and the counters as JSON. MODEL defines ``model``, ``ids``
# and ``loss_of(ids)``.
SCRIPT = textwrap.dedent("""\
    import json, sys, torch, torchtpu_compile
    from torchtpu_compile import graph_cache, versions
    {model}
    compiled = torch.compile(model, backend="torchtpu")
    model.eval()
    with torch.no_grad():
        logits = out_of(compiled(ids))
    model.train()
    loss = loss_of(compiled, ids)
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    model.eval()
    with torch.no_grad():
        after = out_of(compiled(ids))
    stats = torchtpu_compile.stats()
    print(json.dumps({{
        "digest": versions.source_digest(*graph_cache._KEYED_SOURCES),
        "logits": logits.flatten().tolist(), "loss": loss.item(),
        "grads": [p.grad.flatten().tolist() for p in model.parameters() if p.grad is not None],
        "after": after.flatten().tolist(),
        "buffers": [b.flatten().tolist() for b in model.buffers()],
        "caches": {{name: counts["all"] for name, counts in stats["caches"].items()}},
        "compiled": stats["graphs_compiled"],
        "lowering_seconds": stats["lowering_seconds"]}}))
""")

# Embedding, LayerNorm, causal SDPA, a GELU MLP and BatchNorm (whose running statistics are
# inputs mutated in training: aot_autograd's runtime wrappers must come back from the cache).
BLOCK = textwrap.dedent("""\
    import torch.nn as nn, torch.nn.functional as F
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.norm = nn.Embedding(50, 32), nn.LayerNorm(32)
            self.qkv = nn.Linear(32, 96)
            self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
            self.bn = nn.BatchNorm1d(32)
        def forward(self, ids):
            h = self.norm(self.embed(ids))
            q, k, v = self.qkv(h).view(2, 8, 3, 4, 8).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + a.transpose(1, 2).reshape(2, 8, 32) + self.mlp(h)
            return self.bn(h.transpose(1, 2)).transpose(1, 2)
    torch.manual_seed(0)
    model, ids = Block(), torch.randint(0, 50, (2, 8))
    out_of = lambda out: out
    loss_of = lambda m, ids: m(ids).pow(2).mean()
""")


def run_script(cache_dir, model: str = BLOCK) -> dict:
    """Run SCRIPT with ``model`` in a fresh interpreter over the cache in ``cache_dir``."""
    env = python_env(TORCHTPU_CACHE_DIR=str(cache_dir))
    env.pop("TORCHTPU_REMOTE_CACHE", None)
    env.pop("TORCHTPU_GRAPH_CACHE", None)
    code = SCRIPT.format(model=model)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cold_then_warm(cache_dir, model: str = BLOCK, attempts: int = 3):
    """(cold, warm) runs over one cache dir, with the same torchtpu sources in both.

    Others may edit torchtpu's sources while the test runs; an edit between the two processes
    rightly changes every key (versions.source_digest), so such a pair is run again.
    """
    for attempt in range(attempts):
        directory = f"{cache_dir}-{attempt}"
        cold, warm = run_script(directory, model), run_script(directory, model)
        if cold["digest"] == warm["digest"]:
            return cold, warm
    pytest.skip("torchtpu's sources kept changing between the two processes")


def check_warm_hits_everything(cold: dict, warm: dict) -> None:
    """Every graph of the warm run came from the graph cache, and every number is the same."""
    aot, lowering = cold["caches"]["aot_autograd"], cold["caches"]["lowering"]
    # Dynamo graphs: inference (no_grad) and training; the training entry holds forward and
    # backward together.
    assert aot["misses"] >= 2 and aot["hits"] == 0 and aot["bytes_written"] > 0
    assert lowering["misses"] >= 3 and cold["compiled"] >= 3
    warm_aot, warm_lowering = warm["caches"]["aot_autograd"], warm["caches"]["lowering"]
    assert warm_aot["hits"] == aot["misses"] and warm_aot["misses"] == 0
    assert warm_aot["seconds_saved"] > 0
    assert warm_lowering["hits"] == lowering["misses"] and warm_lowering["misses"] == 0
    assert warm["compiled"] == 0 and warm["lowering_seconds"] == 0  # no torch-mlir, no XLA
    for name in ("logits", "loss", "grads", "after", "buffers"):
        assert warm[name] == cold[name], name  # bit for bit


def test_warm_process_hits_every_graph_and_matches_the_cold_one(tmp_path):
    check_warm_hits_everything(*cold_then_warm(tmp_path / "cache"))


@pytest.fixture
def isolated_cache(tmp_path):
    """An empty disk cache for this process, and no level-1 entries at any cache. The
    Dynamo-level cache, which would answer before these levels are asked, is off: its own
    tests are test_dynamo_cache.py's."""
    def forget():
        executable.clear_cache()
        graph_cache.clear_memory()
        lowering_cache.clear_memory()
        dynamo_cache.clear_memory()
        torch._dynamo.reset()
        torchtpu_compile.reset_stats()

    with torchtpu_compile.config.patch(cache_dir=str(tmp_path / "cache"), remote_cache=None,
                                       graph_cache=True, dynamo_cache=False):
        forget()
        yield forget
    forget()


def graph_entries(cache_dir) -> list:
    directory = os.path.join(cache_dir, GRAPH_FOLDER)
    return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                  if name.endswith(".xla"))


def counts(name: str) -> dict:
    """The counters of the cache ``name``, all levels together."""
    return torchtpu_compile.stats()["caches"][name]["all"]


def test_corrupt_entries_are_discarded_and_recomputed(isolated_cache, caplog):
    f = lambda x: torch.tanh(x @ x.T) * 3
    x = torch.randn(8, 8)
    expected = compile_tpu(f)(x)
    entries = graph_entries(torchtpu_compile.config.cache_dir)
    assert len(entries) == 2  # the aot_autograd result and the lowered StableHLO
    for path in entries:
        blob = bytearray(open(path, "rb").read())
        blob[-20] ^= 0xFF
        open(path, "wb").write(bytes(blob))
    isolated_cache()
    with caplog.at_level("WARNING", logger="torchtpu"):
        again = compile_tpu(f)(x)
    assert torch.equal(again, expected)
    assert counts("aot_autograd")["corrupt"] == 1 and counts("aot_autograd")["hits"] == 0
    assert counts("lowering")["corrupt"] == 1 and counts("lowering")["hits"] == 0
    assert sum("corrupt" in r.getMessage() for r in caplog.records) == 2
    for path in graph_entries(torchtpu_compile.config.cache_dir):
        frame.unpack(open(path, "rb").read())  # rewritten whole


def first_compile_then_variant(isolated_cache, base, variant):
    """Compile ``base()`` (a miss), forget level 1, then run ``variant()``; its counters."""
    base()
    assert counts("aot_autograd")["misses"] == 1
    isolated_cache()
    return variant()


def test_same_graph_hits_from_disk(isolated_cache):
    f = lambda x: torch.sin(x) * 2
    x = torch.randn(4, 8)
    out = first_compile_then_variant(isolated_cache, lambda: compile_tpu(f, dynamic=False)(x),
                                     lambda: compile_tpu(f, dynamic=False)(x))
    torch.testing.assert_close(out, f(x))
    assert counts("aot_autograd")["hits"] == 1 and counts("lowering")["hits"] == 1


def test_an_entry_whose_trace_fixed_a_float_input_is_not_served(isolated_cache):
    # AdamW under a scheduler that cycles beta1 (OneCycleLR's cycle_momentum): Dynamo passes
    # the changing floats as 0-d tensor inputs, and aot_autograd's trace bakes beta1's value
    # into pow.Scalar(beta1, step), with a guard that torch's cache entry cannot record. Served
    # to a warm process, the entry of the last beta1 compiled ran every later step with it.
    def train(compiled: bool):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x = torch.randn(3, 4)
        step = torch.compile(opt.step, backend="torchtpu") if compiled else opt.step
        for beta1, lr in ((0.95, 0.01), (0.9, 0.02), (0.85, 0.03), (0.9, 0.02), (0.95, 0.01)):
            opt.param_groups[0]["betas"] = (beta1, 0.999)
            opt.param_groups[0]["lr"] = lr
            opt.zero_grad()
            model(x).square().sum().backward()
            step()
        return [p.detach() for p in model.parameters()]

    train(compiled=True)
    isolated_cache()   # a fresh process over the same disk cache
    for got, expected in zip(train(compiled=True), train(compiled=False)):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_backward_through_a_retained_graph_runs_twice(isolated_cache, warm):
    # The graph cache compiles every backward with its forward; aot_autograd then refused
    # backward(retain_graph=True) ("compiled with non-empty donated buffers"), which eager
    # runs: gradient accumulation through one retained graph, a GAN's two losses.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)

    def grads(fn):
        model.zero_grad()
        loss = fn(x).square().sum()
        loss.backward(retain_graph=True)
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    with config.patch(matmul_precision="highest"):
        if warm:
            grads(torch.compile(model, backend="torchtpu"))
            isolated_cache()
        got = grads(torch.compile(model, backend="torchtpu"))
    for g, expected in zip(got, grads(model)):
        torch.testing.assert_close(g, expected)


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_forward_ad_duals_through_a_cached_graph_get_eagers_tangents(isolated_cache, warm):
    # Duals run the graph's own code (an XLA program has no tangents); a graph the cache
    # unpickled had none until asked: "missing the required 'forward' function" in every
    # warm process.
    import torch.autograd.forward_ad as fwAD

    def f(a, b):
        return (torch.sin(a) @ b).softmax(-1)

    a, b = torch.randn(3, 4), torch.randn(4, 4)
    tangent_a, tangent_b = torch.randn(3, 4), torch.randn(4, 4)

    def jvp(fn):
        with fwAD.dual_level():
            out = fn(fwAD.make_dual(a, tangent_a), fwAD.make_dual(b, tangent_b))
            return fwAD.unpack_dual(out)

    with config.patch(matmul_precision="highest"):
        if warm:
            jvp(torch.compile(f, backend="torchtpu"))
            isolated_cache()
        primal, tangent = jvp(torch.compile(f, backend="torchtpu"))
    want_primal, want_tangent = jvp(f)
    torch.testing.assert_close(primal, want_primal)
    torch.testing.assert_close(tangent, want_tangent)


def test_an_entry_holds_the_graph_aot_autograd_gave_not_the_lowered_one(tmp_path):
    # The lowering rewrites a graph in place before importing it (lower/fx_passes.py), and one
    # rewrite changes what an op means: c_fmod_as_remainder renames our C-fmod op
    # aten.remainder, which StableHLO computes as C's fmod. The entry pickled that rewritten
    # graph; a warm process lowered it again, as eager's remainder: (arange(10) - 7) % 5 gave
    # fmod's -2 for 3, a silent wrong result. (The entry now calls our op, which a fresh
    # process must register before unpickling it.)
    from tests.support.warm_workloads import WORKLOADS, cold_then_warm
    cold, warm = cold_then_warm("remainder_of_literals", tmp_path / "cache")
    assert warm["counters"]["caches"]["aot_autograd"]["hits"] == 1, warm["counters"]
    for name, expected in WORKLOADS["remainder_of_literals"](compiled=False).items():
        assert torch.equal(cold["results"][name], expected), name
        assert torch.equal(warm["results"][name], expected), name


def test_graphs_naming_a_decomposition_s_jax_function_load_in_a_new_process(tmp_path):
    # A decomposition's JAX function (an FFT, complex arithmetic, a bit view across widths,
    # a Cholesky factor) is registered as an op on first use. An entry naming one did not
    # unpickle in a new process ("'torchtpu_jax' object has no attribute ..."): a miss and a
    # warning in every warm process, compiled graphs and the eager device's traces alike.
    # The Cholesky graph's effect token is not put back by torch's loader: it is not kept.
    from tests.support.warm_workloads import check_cold_warm_eager
    cold, warm = check_cold_warm_eager("jax_function_ops", tmp_path / "cache")
    caches = warm["counters"]["caches"]
    assert caches["aot_autograd"]["corrupt"] == 0 and caches["eager_traces"]["corrupt"] == 0, \
        caches
    assert caches["aot_autograd"]["hits"] + caches["dynamo"]["hits"] >= 1, caches
    assert caches["eager_traces"]["misses"] == 0, caches


@pytest.mark.parametrize("change", ["dtype", "shape", "requires_grad"])
def test_changed_inputs_do_not_hit(isolated_cache, change):
    f = lambda x: torch.sin(x) * 2
    x = torch.randn(4, 8)
    y = {"dtype": x.double(), "shape": torch.randn(4, 9),
         "requires_grad": x.clone().requires_grad_()}[change]
    out = first_compile_then_variant(isolated_cache, lambda: compile_tpu(f, dynamic=False)(x),
                                     lambda: compile_tpu(f, dynamic=False)(y))
    assert counts("aot_autograd")["hits"] == 0
    assert counts("aot_autograd")["misses"] == 1
    torch.testing.assert_close(out, f(y))
    assert out.dtype == y.dtype and out.requires_grad == y.requires_grad


def test_changed_model_code_does_not_hit(isolated_cache):
    # Same name, same shapes, one op different: as after editing a model's forward.
    def make(op):
        def forward(x):
            return op(x) * 2
        return forward
    x = torch.randn(4, 8)
    out = first_compile_then_variant(isolated_cache,
                                     lambda: compile_tpu(make(torch.sin), dynamic=False)(x),
                                     lambda: compile_tpu(make(torch.cos), dynamic=False)(x))
    assert counts("aot_autograd")["hits"] == 0 and counts("lowering")["hits"] == 0
    torch.testing.assert_close(out, torch.cos(x) * 2)


def test_changed_tensor_attribute_gives_the_new_result(isolated_cache):
    """A plain tensor attribute is a graph input (Dynamo lifts it), never a cached constant."""
    class Shift(torch.nn.Module):
        def __init__(self, value):
            super().__init__()
            self.shift = torch.full((4,), value)  # neither parameter nor buffer

        def forward(self, x):
            return x * 3 + self.shift

    x = torch.randn(4)
    out = first_compile_then_variant(isolated_cache, lambda: compile_tpu(Shift(1.0))(x),
                                     lambda: compile_tpu(Shift(2.0))(x))
    assert counts("aot_autograd")["hits"] == 1  # same graph: reusing it is right
    torch.testing.assert_close(out, x * 3 + 2)


def test_precision_reuses_aot_result_but_not_lowering(isolated_cache):
    f = lambda a, b: a @ b
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    with config.patch(matmul_precision="highest"):
        exact = compile_tpu(f, dynamic=False)(a, b)
    isolated_cache()
    with config.patch(matmul_precision="medium"):
        medium = compile_tpu(f, dynamic=False)(a, b)
    # The aot_autograd graph does not depend on precision; its lowering and executable do.
    assert counts("aot_autograd")["hits"] == 1
    assert counts("lowering")["hits"] == 0 and counts("lowering")["misses"] == 1
    assert torchtpu_compile.stats()["graphs_compiled"] == 1
    torch.testing.assert_close(exact, a @ b, rtol=1e-5, atol=1e-5)
    reference = (a.bfloat16().float() @ b.bfloat16().float())  # bf16 operands, f32 sums
    torch.testing.assert_close(medium, reference, rtol=1e-4, atol=1e-4)
    assert not torch.equal(medium, exact)


def test_switched_off(isolated_cache):
    with config.patch(graph_cache=False):
        out = compile_tpu(lambda x: x.exp() - 1, dynamic=False)(torch.ones(3))
    torch.testing.assert_close(out, torch.ones(3).exp() - 1)
    for name in ("aot_autograd", "lowering"):
        assert counts(name)["hits"] == counts(name)["misses"] == 0
    assert not os.path.exists(os.path.join(torchtpu_compile.config.cache_dir, GRAPH_FOLDER))


def test_dynamic_graph_from_the_cache_serves_other_sizes(isolated_cache):
    """A graph with symbolic sizes comes back with its symbols; each size runs correctly."""
    f = lambda x: torch.softmax(x * 2, dim=-1).sum(-1)
    compile_tpu(f, dynamic=True)(torch.randn(3, 5))
    isolated_cache()
    compiled = compile_tpu(f, dynamic=True)
    for rows, cols in ((3, 5), (4, 7), (2, 9)):
        x = torch.randn(rows, cols)
        torch.testing.assert_close(compiled(x), f(x))
    assert counts("aot_autograd")["hits"] == 1


def test_a_given_collective_plan_is_passed_down_not_planned_again(isolated_cache, monkeypatch):
    """``lower_graph_cached(..., collectives=plan)`` hands the caller's plan to ``lower_graph``
    (a program with collectives is not cached) instead of planning the graph once more."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchtpu_compile.lower import collective_graphs
    gm = make_fx(lambda x: torch.sin(x) * 2)(torch.randn(4))
    plan, lowered, calls = object(), object(), []

    def lower_graph(graph, **kwargs):
        calls.append((graph, kwargs))
        return lowered

    def plan_again(graph):
        raise AssertionError("planned again")

    monkeypatch.setattr(lowering_cache, "lower_graph", lower_graph)
    monkeypatch.setattr(collective_graphs, "plan_collectives", plan_again)
    assert lowering_cache.lower_graph_cached(gm, "cpu", "highest", collectives=plan) is lowered
    assert calls == [(gm, {"platform": "cpu", "precision": "highest", "collectives": plan})]
    assert counts("lowering")["hits"] == counts("lowering")["misses"] == 0


# An output that is a view of another output made by linear on a 3-D input (its reshape is an
# _unsafe_view): torch 2.13 pickles that view's replay with sizes read from freed memory, and
# the entry rebuilt the output from them ("shape '[94250163632215, 4594155876129682724, 4]' is
# invalid", or a segfault: fuzz seed 8141), in the process that wrote it and in the next.
ALIAS_OF_LINEAR = textwrap.dedent("""\
    import json, torch, torch.nn.functional as F
    torch.set_float32_matmul_precision("highest")
    def f(x, w):
        y = F.linear(x, w)
        z = y.unflatten(0, (1, -1))
        p = F.pad(x, (2, -1))
        return y, z, p, z.sum().float() + p.sum().float()
    x = torch.tensor([[[-0.3249, 0.1486]], [[-0.522, 1.1598]], [[-0.9743, 1.4348]]])[..., ::2]
    w = torch.tensor([[1.3192, 0.1907, 1.9894, 1.8243]]).t()
    x.requires_grad_(), w.requires_grad_()
    ours, want = torch.compile(f, backend="torchtpu")(x, w), f(x, w)
    print(json.dumps({"same": all(a.shape == b.shape and torch.allclose(a, b)
                                  for a, b in zip(ours, want))}))
""")


def test_an_output_viewing_a_linear_output_comes_back_from_the_cache(tmp_path):
    env = python_env(TORCHTPU_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("TORCHTPU_GRAPH_CACHE", None)
    for process in ("writes the entry", "loads it"):
        proc = subprocess.run([sys.executable, "-c", ALIAS_OF_LINEAR], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (process, proc.returncode, proc.stderr[-2000:])
        assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"same": True}, process
