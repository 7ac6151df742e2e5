"""Issue 5's acceptance run for dynamic dims: an artifact with a dynamic batch, saved, loaded
in a fresh process and run at two batch sizes (two buckets), bit-identical to this process and
close to eager."""
import subprocess
import sys
import textwrap

import pytest
import torch

import torchtpu_compile.aot as aot
from tests.support import python_env
from tests.support.aot_factories import save_dynamic_batch_stats

pytestmark = pytest.mark.slow

def test_two_batch_sizes_in_a_fresh_process_match_this_process_and_eager(tmp_path):
    path = str(tmp_path / "stats.tpu")
    model, _ = save_dynamic_batch_stats(path)
    inputs = {n: torch.randn(n, 8) for n in (3, 11)}  # buckets 8 and 16
    torch.save(inputs, tmp_path / "inputs.pt")
    here = aot.load(path)
    expected = {n: here(x) for n, x in inputs.items()}
    for n, x in inputs.items():
        for got, want in zip(expected[n], model(x)):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    code = textwrap.dedent("""
        import sys, torch
        import torchtpu_compile.aot as aot
        run = aot.load(sys.argv[1])
        inputs = torch.load(sys.argv[2])
        torch.save({n: run(x) for n, x in inputs.items()}, sys.argv[3])
        print("recompiled", run.recompiled)
        print("heavy", [m for m in ("torch_mlir", "torch._dynamo") if m in sys.modules])
    """)
    done = subprocess.run([sys.executable, "-c", code, path, str(tmp_path / "inputs.pt"),
                           str(tmp_path / "out.pt")], env=python_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "recompiled False" in done.stdout
    assert "heavy []" in done.stdout  # padding and unpadding need no Dynamo, no torch-mlir
    fresh = torch.load(tmp_path / "out.pt")
    for n in inputs:
        assert all(torch.equal(a, b) for a, b in zip(fresh[n], expected[n]))


def test_gpt2_with_dynamic_batch_and_sequence_matches_eager(tmp_path):
    from tests.support.aot_factories import gpt2
    model, (ids,) = gpt2()
    batch = torch.export.Dim("batch", min=1, max=8)
    seq = torch.export.Dim("seq", min=2, max=32)
    path = str(tmp_path / "gpt2.tpu")
    artifact = aot.compile(model, (ids,), dynamic_shapes=({0: batch, 1: seq},),
                           precision="highest")
    assert len(artifact.manifest["programs"]) == 3  # seq buckets 8, 16, 32 x batch bucket 8
    artifact.save(path)
    run = aot.load(path)
    for b, s in ((1, 5), (3, 17), (8, 32)):
        x = torch.randint(0, 100, (b, s))
        torch.testing.assert_close(run(x)[0], model(x).logits, rtol=1e-5, atol=1e-5)
