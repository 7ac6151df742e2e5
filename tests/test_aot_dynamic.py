"""AOT artifacts with dynamic dims: one program per bucket, inputs padded, outputs cut back.

The fresh-process round trip is in tests/slow/test_aot_dynamic_fresh.py.
"""
import pytest
import torch

import torchtpu_compile.aot as aot
from tests.support.aot_factories import BatchStats, save_dynamic_batch_stats
from torchtpu_compile.errors import LoweringError


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    path = tmp_path_factory.mktemp("aot_dynamic") / "stats.tpu"
    model, manifest = save_dynamic_batch_stats(path)
    return str(path), model, manifest


def test_one_program_per_bucket_recorded_with_the_dims(artifact):
    _, _, manifest = artifact
    assert [p["name"] for p in manifest["programs"]] == ["bucket_8", "bucket_16"]
    (dim,) = manifest["dynamic_dims"]
    assert (dim["input"], dim["dim"], dim["min"], dim["max"], dim["buckets"]) == \
        ("x", 0, 2, 16, [8, 16])
    assert manifest["inputs"][0]["dynamic"] == {"0": dim["symbol"]}


def test_each_bucket_pads_and_cuts_back_like_eager(artifact):
    path, model, _ = artifact
    run = aot.load(path)
    for n in (2, 3, 8, 11, 16):  # both buckets, at and below their sizes
        x = torch.randn(n, 8)
        for got, want in zip(run(x), model(x)):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_sizes_outside_the_dim_range_name_the_input_and_dim(artifact):
    run = aot.load(artifact[0])
    with pytest.raises(ValueError, match=r"input 'x' has size 17 in dim 0; .* sizes 2 to 16 "
                                         r"there \(buckets \[8, 16\]\)"):
        run(torch.randn(17, 8))
    with pytest.raises(ValueError, match="input 'x' has size 1 in dim 0"):
        run(torch.randn(1, 8))
    # A wrong static dim shows the dynamic ones as their ranges, not torch's symbols (<s27>).
    with pytest.raises(ValueError, match=r"input 'x' has shape \[4, 9\] .* for shape "
                                         r"\[2\.\.16, 8\] and dtype float32"):
        run(torch.randn(4, 9))
    with pytest.raises(ValueError, match="input 'x' is a meta tensor"):
        run(torch.randn(4, 8, device="meta"))


def test_a_dim_without_upper_bound_is_refused_at_export():
    batch = torch.export.Dim("batch", min=2)
    with pytest.raises(LoweringError, match="input 'x' dim 0 is dynamic without an upper "
                                            "bound; give its torch.export.Dim a max="):
        aot.compile(BatchStats().eval(), (torch.randn(5, 8),), dynamic_shapes=({0: batch},))


def test_inspect_shows_the_dims_and_each_bucket_program(artifact, capsys):
    from torchtpu_compile.aot.__main__ import main
    assert main(["inspect", artifact[0]]) == 0
    shown = capsys.readouterr().out
    for text in ("x: float32[5, 8] (example; dynamic dims 0)",
                 "dynamic dims: x[0] in 2..16, buckets [8, 16]",
                 "program bucket_8: outputs float32[8, 3], float32[16]",
                 "program bucket_16: outputs float32[16, 3], float32[16]",
                 "executables/cpu/bucket_16.bin", "stablehlo/bucket_8.portable"):
        assert text in shown


def test_tpu_tensors_are_padded_and_cut_back_on_the_device(artifact):
    import torchtpu_eager  # noqa: F401  (the "tpu" device)
    path, model, _ = artifact
    x = torch.randn(3, 8)
    outputs = aot.load(path)(x.to("tpu"))
    for got, want in zip(outputs, model(x)):
        assert got.device.type == "tpu" and got.shape == want.shape
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_size_expressions_round_trip_through_the_manifest():
    from torch.utils._sympy.functions import FloorDiv

    from torchtpu_compile.aot.dynamic import _symbol, dump_expr, parse_expr
    from torchtpu_compile.buckets.layout import evaluate
    s0 = _symbol("s0")
    for expr in (s0, 2 * s0 + 1, FloorDiv(s0, 2), 3 * FloorDiv(s0 + 1, 2)):
        text = dump_expr(expr, {s0: 16})
        for n in (3, 8, 11):
            assert evaluate(parse_expr(text, {"s0": s0}), {s0: n}) == evaluate(expr, {s0: n})
