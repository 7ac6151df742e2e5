"""A fast subset of PyTorch's OpInfo database on each path, against eager CPU, in fp32.

The whole sweep (every entry, fp32 and bf16) is tests/slow/test_opinfo_full.py; the harness is
tests/support/opinfo. Entries here span the families the backend must get right: elementwise math,
broadcasting binaries, reductions, matmuls, shape and indexing ops, nn.functional layers, and
the ops our own decompositions cover (lower/decompositions/). Each passes on the compile and
eager paths (a few on the fuse path too, FUSE): an entry that starts falling back to eager
PyTorch, or is skipped, fails here.
"""
from __future__ import annotations

import pytest
import torch

from torchtpu_compile import config
from tests.support.opinfo.harness import check, entry_name
from tests.support.opinfo.verdict import assert_passes

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

FAST = [
    # elementwise and broadcasting
    "add", "mul", "div.no_rounding_mode", "sub", "pow", "exp", "log", "tanh", "sigmoid",
    "rsqrt", "erf", "where", "maximum", "atan2", "lerp", "isclose",
    # reductions
    "sum", "mean", "amax", "argmax", "var_mean", "logsumexp", "prod", "norm",
    # matmuls and convolutions
    "matmul", "addmm", "baddbmm", "einsum", "nn.functional.linear", "nn.functional.conv2d",
    # shape, indexing, creation
    "cat", "stack", "permute", "reshape", "index_select", "gather", "scatter_add",
    "index_put", "masked_fill", "tril", "flip", "roll", "arange", "full_like", "topk", "sort",
    # nn.functional
    "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.gelu",
    "nn.functional.embedding", "nn.functional.cross_entropy", "nn.functional.max_pool2d",
    "nn.functional.group_norm", "nn.functional.batch_norm",
    # our decompositions
    "remainder", "cumsum", "cummax", "diagonal", "kthvalue", "cdist", "fmax", "clamp_max",
    "addmv",
]


#: The defer-and-fuse path (the tpu device recording the op and running it as one spliced
#: program when the results come back) on the FAST entries that write, index, view or lower to
#: several ops, where splicing and the recording's bookkeeping could go wrong.
FUSE = ["index_put", "scatter_add", "masked_fill", "cumsum", "var_mean", "sort", "topk",
        "roll", "diagonal", "addmm", "nn.functional.layer_norm", "nn.functional.batch_norm",
        "nn.functional.embedding", "nn.functional.max_pool2d"]


def _op_db() -> dict:
    from torch.testing._internal.common_methods_invocations import op_db
    return {entry_name(op): op for op in op_db}


OPS = _op_db()


@pytest.mark.parametrize("path, entry", [(path, entry) for path in ("compile", "eager")
                                         for entry in FAST] + [("fuse", e) for e in FUSE])
def test_opinfo_fp32(entry, path):
    # FAST entries pass on both paths today: a fallback or a skip is a regression, not an xfail.
    with config.patch(matmul_precision="highest"):
        result = check(OPS[entry], path, torch.float32, max_samples=2)
    assert_passes(result)


def test_fast_subset_names_real_entries():
    assert not set(FAST) - set(OPS), "FAST names entries that op_db does not have"
    assert not set(FUSE) - set(FAST), "FUSE names entries that FAST does not have"


def test_every_skip_names_an_entry_a_category_and_a_reason():
    from tests.support.opinfo.skips import CATEGORIES, SKIPS
    assert not set(SKIPS) - set(OPS), "skips.py names entries that op_db does not have"
    for name, skip in SKIPS.items():
        assert skip.category in CATEGORIES and len(skip.reason) > 20, name


@pytest.mark.parametrize("path", ["eager", "fuse"])
def test_device_paths_report_why_they_cannot_run(monkeypatch, path):
    from tests.support.opinfo import paths
    monkeypatch.setattr(paths, "eager_available", lambda: paths.EAGER_UNAVAILABLE)
    with config.patch(matmul_precision="highest"):
        result = check(OPS["add"], path, torch.float32)
    assert (result.status, result.category, result.detail) == \
        ("skip", "unavailable", "eager tpu device not available yet")


def test_a_fallback_is_not_a_pass():
    # nonzero's output shape depends on the data: Dynamo runs it eagerly, so it is not XLA.
    with config.patch(matmul_precision="highest"):
        result = check(OPS["nonzero"], "compile", torch.float32, max_samples=1)
    assert result.status == "fallback" and result.category == "xla-unsupported", result


def test_bf16_result_that_cancels_passes_only_when_as_close_as_eager_bf16():
    # A large sum rounded to bf16 before a bias cancels it misses elementwise tolerances (a
    # bf16 transposed convolution); it passes when no farther from the fp32 answer than eager.
    from tests.support.opinfo.harness import _compare
    g = torch.Generator().manual_seed(0)
    exact = torch.randn(1000, generator=g) * 100
    bias = -exact.round()
    exact_out = exact + bias                           # small, after cancellation
    rounded_first = exact.bfloat16() + bias.bfloat16()  # what we compute
    worse = rounded_first + torch.where(torch.arange(1000) % 2 == 0, 0.25, 0.0).bfloat16()
    _compare(rounded_first, worse, torch.bfloat16, exact_out)
    with pytest.raises(AssertionError, match="against the wider reference"):
        _compare(worse, rounded_first, torch.bfloat16, exact_out)


def test_coverage_zoo_paragraph_counts_the_zoo_not_only_the_results():
    # docs/coverage.md said "37 random-init models" from results older than five of the zoo's
    # models: the paragraph counts the zoo too and names what the results lack.
    from tests.support.opinfo.report import zoo_names, zoo_paragraph
    passed = {"inference": {"status": "pass"}, "training": {"status": "pass"}}
    failed = {"inference": {"status": "pass"}, "training": {"status": "fail"}}
    text = zoo_paragraph({"gpt2": passed, "llama": failed}, ["gpt2", "llama", "detr"])
    assert text.startswith("2 of the 3 random-init models") and "; 1 pass both" in text
    assert "Not in these results (the zoo gained them after the run): detr;" in text
    assert zoo_paragraph({"gpt2": passed}, None).startswith("1 random-init models")
    zoo = zoo_names()
    assert zoo is not None and len(zoo) == len(set(zoo)) >= 37


def test_coverage_names_files_from_the_checkouts_root():
    # After the harness moved to tests/support/opinfo/, the report cut one directory too many
    # from absolute paths in error messages: "(at support/opinfo/paths.py:97)".
    import os
    from tests.support.opinfo import report
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    where = os.path.join(root, "tests", "support", "opinfo", "paths.py")
    assert report._short(f"illegal op (at {where}:97)", 200) == \
        "illegal op (at tests/support/opinfo/paths.py:97)"


def test_complex_logarithms_compare_modulo_two_pi_i():
    # logcumsumexp's complex results are logarithms: XLA's associative scan and the CPU
    # kernel's sequential one land some elements on another branch (imaginary parts 6*pi
    # apart, the same complex value), which the harness failed as a mismatch.
    from tests.support.opinfo.harness import _on_expected_branch
    expected = torch.tensor([1 - 8.9065j, 2 + 0.5j, 3 + 0j])
    actual = torch.tensor([1 + (-8.9065 + 6 * torch.pi) * 1j, 2 + 0.5j, 3 + 0.001j])
    moved = _on_expected_branch((actual,), (expected,))[0]
    torch.testing.assert_close(moved, torch.tensor([1 - 8.9065j, 2 + 0.5j, 3 + 0.001j]))
    assert _on_expected_branch(torch.ones(2), torch.zeros(2)).eq(1).all()  # real: as it is


def test_fuse_path_runs_in_defer_and_fuse_mode_and_restores_the_mode():
    # The fuse path differs from eager only in the mode: it records (one fused program runs
    # when the result comes back) and puts the previous mode back, after an error too.
    import torchtpu_compile
    from tests.support.opinfo.paths import PATHS
    saved = torch.tpu.get_eager_mode()
    out = PATHS["fuse"](lambda a, b: (a + b).sin(), (torch.ones(3), torch.ones(3)), {})
    torch.testing.assert_close(out.value, (torch.ones(3) * 2).sin())
    assert torchtpu_compile.stats()["fused_graphs_run"] >= 1
    assert torch.tpu.get_eager_mode() == saved
    with pytest.raises(RuntimeError):
        PATHS["fuse"](torch.mm, (torch.ones(2, 3), torch.ones(2, 3)), {})
    assert torch.tpu.get_eager_mode() == saved
