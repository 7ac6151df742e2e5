"""Defer-and-fuse compiles a recording only once its key has been seen
``config.fuse_compile_at`` times: before that its ops run one by one through strict mode's
per-op programs, so a loop whose recordings differ each time compiles no program it runs once
or twice. A recording run op by op gives strict mode's values bit for bit; the fused program
gives them to rounding (XLA contracts a product and a sum into one FMA inside a program), and
both eager CPU's."""
import pytest
import torch

import torchtpu_compile
import torchtpu_eager  # noqa: F401  (registers the device)
from torchtpu_compile import config
from tests.support.helpers import eager_mode

TPU = torch.device("tpu", 0)
COUNTED = ("fused_recordings_op_by_op", "fused_graphs_run", "fused_graph_cache_hits",
           "eager_programs_compiled")


@pytest.fixture(autouse=True)
def _tiers():
    # tests/conftest.py compiles at once for the other tests; here a recording is compiled at
    # its second sighting, unless a test says otherwise
    with config.patch(matmul_precision="highest", fuse_compile_at=2):
        yield


def _step(x, w):
    # a matmul, a reduction, dropout (random: drawn from the tpu generator), a write into a
    # view of a computed tensor and an in-place op on it
    h = torch.nn.functional.dropout((x @ w).softmax(-1), 0.3)
    h[:, 0] = h[:, 1] * 2
    h.mul_(3)
    return (h.tanh() + x.sum()).sum(0)


def _inputs(rows, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 11, generator=g), torch.randn(11, 9, generator=g)


def _run(x, w, seed):
    torch.manual_seed(seed)
    return _step(x.to(TPU), w.to(TPU)).cpu()


def _deltas(fn):
    before = torchtpu_compile.stats()
    result = fn()
    after = torchtpu_compile.stats()
    return result, {k: after[k] - before[k] for k in COUNTED}


def test_a_recording_runs_op_by_op_until_seen_twice_and_every_tier_gives_stricts_values():
    assert config.fuse_compile_at == 2
    x, w = _inputs(6, 0)  # a shape no other test records: this test sees its keys first
    with eager_mode("strict"):
        strict = [_run(x, w, seed) for seed in range(3)]  # builds every per-op program
    for seed, want in enumerate(strict):
        torch.manual_seed(seed)
        cpu = _step(x, w)
        torch.testing.assert_close(want, cpu)  # the tpu generator draws the CPU's numbers
    with eager_mode("defer_and_fuse"):
        tiers = [_deltas(lambda seed=seed: _run(x, w, seed)) for seed in range(3)]
    assert torch.equal(tiers[0][0], strict[0])  # op by op: strict's programs, strict's bits
    for (got, _), want in zip(tiers, strict):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    (_, first), (_, second), (_, third) = tiers
    recordings = first["fused_recordings_op_by_op"]
    assert recordings >= 1
    # seen once: op by op, through the programs strict built, so nothing compiled
    assert first == {"fused_recordings_op_by_op": recordings, "fused_graphs_run": 0,
                     "fused_graph_cache_hits": 0, "eager_programs_compiled": 0}
    # seen twice: each recording compiled as one program
    assert second == {"fused_recordings_op_by_op": 0, "fused_graphs_run": recordings,
                      "fused_graph_cache_hits": 0, "eager_programs_compiled": recordings}
    # then taken from the cache
    assert third == {"fused_recordings_op_by_op": 0, "fused_graphs_run": recordings,
                     "fused_graph_cache_hits": recordings, "eager_programs_compiled": 0}


@pytest.mark.parametrize("compile_at", [1, 3])
def test_the_sighting_that_compiles_is_configurable(compile_at):
    x = torch.randn(2 + compile_at, 3)  # a shape per parameter: keys not seen before

    def run():
        return ((x.to(TPU) * 3 + 1).tanh() - x.to(TPU)).cpu()

    with eager_mode("strict"):
        want = run()
    with config.patch(fuse_compile_at=compile_at), eager_mode("defer_and_fuse"):
        runs = [_deltas(run) for _ in range(compile_at + 1)]
    for got, counts in runs:
        if counts["fused_recordings_op_by_op"]:
            assert torch.equal(got, want)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    by_op = [d["fused_recordings_op_by_op"] > 0 for _, d in runs]
    compiled = [d["fused_graphs_run"] - d["fused_graph_cache_hits"] > 0 for _, d in runs]
    assert by_op == [True] * (compile_at - 1) + [False, False]
    assert compiled == [False] * (compile_at - 1) + [True, False]


def test_recordings_that_differ_each_time_compile_only_per_op_programs():
    # a sentence per step, each of another length, each a recording of its own: each was
    # compiled whole, never to run again; now they run through the per-op programs strict
    # mode runs, so strict, after them, finds every program it needs built
    emb = torch.randn(23, 8, generator=torch.Generator().manual_seed(0))

    def sentences():
        table = emb.to(TPU)
        return [table[torch.arange(n, device=TPU) + 3].tanh().sum(0).cpu() for n in (5, 6, 7)]

    with eager_mode("defer_and_fuse"):
        fused, counts = _deltas(sentences)
    assert counts["fused_graphs_run"] == 0 and counts["fused_recordings_op_by_op"] >= 3
    with eager_mode("strict"):
        strict, counts = _deltas(sentences)
    assert counts["eager_programs_compiled"] == 0
    for got, want, n in zip(fused, strict, (5, 6, 7)):
        assert torch.equal(got, want)
        torch.testing.assert_close(got, emb[torch.arange(n) + 3].tanh().sum(0))


def test_an_index_out_of_range_in_a_recording_run_op_by_op_raises_eagers_error():
    x = torch.arange(5.0)
    with pytest.raises(IndexError) as expected:
        x[torch.tensor([7])]
    with eager_mode("defer_and_fuse"):
        got = x.to(TPU)[torch.tensor([7]).to(TPU)] * 2  # the line the error names
        with pytest.raises(IndexError) as info:
            got.cpu()
    assert torchtpu_compile.stats()["fused_recordings_op_by_op"] == 1
    assert str(expected.value) in str(info.value)
    assert "the line the error names" in str(info.value)


def test_a_recording_run_op_by_op_lets_each_temporary_go_after_its_last_read():
    # as strict mode does: ten temporaries of 1 MiB, each read once, never all held at once
    x = torch.randn(512, 512).to(TPU)
    with eager_mode("defer_and_fuse"):
        torch.tpu.reset_peak_memory_stats()
        start = torch.tpu.memory_allocated()
        y = x
        for _ in range(10):
            y = y * 1.5
        y.cpu()
        assert torchtpu_compile.stats()["fused_recordings_op_by_op"] == 1
        assert torch.tpu.max_memory_allocated() - start <= 3 * x.nbytes
