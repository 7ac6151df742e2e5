"""torchtpu_compile.numerics: compare, locate, the CLI and the pytest fixture.

The planted divergence wraps torchtpu's lowering (``lower_graph``) so that one op,
``aten.tanh``, comes out 1% too large under torchtpu while eager PyTorch is untouched; locate
must name that op and the line of ``Planted.forward`` that called it.
"""
from __future__ import annotations

import copy
import inspect
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import torchtpu_compile
import torchtpu_compile.program.build
from tests.support import zoo
from torchtpu_compile.numerics import Tolerance, compare, tolerance
from torchtpu_compile.numerics.policy import compare_tensors

# The product's pytest plugin (its assert_numerics fixture), as a project's tests load it.
pytest_plugins = ["torchtpu_compile.numerics.pytest_plugin"]

aten = torch.ops.aten
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- models ----------------------------------------------------------------------------------

def mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 10))
    return model, (torch.randn(8, 16),)


class Planted(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        h = self.fc1(x).relu()
        h = torch.tanh(h)  # the planted divergence
        return self.fc2(h)


PLANTED_LINE = next(
    inspect.getsourcelines(Planted.forward)[1] + i
    for i, line in enumerate(inspect.getsourcelines(Planted.forward)[0])
    if "# the planted divergence" in line)


def planted():
    torch.manual_seed(0)
    return Planted(), (torch.randn(4, 16),)


def scale_op_after_lowering(lower_graph, op, factor):
    """``lower_graph`` with every ``op`` node's result multiplied by ``factor`` first."""
    def perturbed(gm, **kwargs):
        gm = copy.deepcopy(gm)
        for node in list(gm.graph.nodes):
            if node.target is op:
                with gm.graph.inserting_after(node):
                    scaled = gm.graph.call_function(aten.mul.Tensor, (node, factor))
                scaled.meta["val"] = node.meta["val"]
                node.replace_all_uses_with(
                    scaled, delete_user_cb=lambda user, scaled=scaled: user is not scaled)
        gm.recompile()
        return lower_graph(gm, **kwargs)
    return perturbed


@pytest.fixture
def tanh_one_percent_high(monkeypatch):
    """torchtpu's aten.tanh is 1% too large until the test ends (a new lowering, so the
    compile cache, keyed by StableHLO, compiles it anew)."""
    import torchtpu_compile.lower.cache as lowering_cache
    planted_lowering = scale_op_after_lowering(lowering_cache.lower_graph, aten.tanh.default, 1.01)
    monkeypatch.setattr(lowering_cache, "lower_graph", planted_lowering)
    monkeypatch.setattr(torchtpu_compile.program.build, "lower_graph", planted_lowering)
    # Cached lowerings of the same graph (from earlier tests) must not answer for the plant.
    with torchtpu_compile.config.patch(graph_cache=False):
        yield


# --- the tolerance policy ----------------------------------------------------------------------

def test_tolerance_table():
    assert tolerance("highest", torch.float32) == Tolerance(1e-4, 1e-6)
    assert tolerance("medium", torch.float32).rtol == 3e-2
    assert tolerance("medium", torch.bfloat16) == tolerance("highest", torch.bfloat16)
    assert tolerance("medium", torch.float64).rtol < 1e-6
    assert tolerance("high", torch.int64) == Tolerance(0.0, 0.0)
    with pytest.raises(ValueError, match="expected one of medium, high, highest"):
        tolerance("low", torch.float32)


def test_errors_are_relative_to_the_reference_scale():
    expected = torch.tensor([10.0, 1.0, 1e-6, float("nan"), float("inf")])
    actual = expected.clone()
    actual[1] += 5e-4  # 5e-5 of the scale (10)
    check = compare_tensors("y", actual, expected, Tolerance(1e-4, 0))
    assert check.passed, check
    assert check.scale == 10.0 and check.max_abs == pytest.approx(5e-4, rel=1e-3)
    assert check.rel_max_abs == pytest.approx(5e-5, rel=1e-3)
    assert check.max_rel == pytest.approx(5e-4, rel=1e-3)
    actual[2] = 0.01  # 1e-3 of the scale: fails; max_rel's denominator floors at 1e-3 * scale
    check = compare_tensors("y", actual, expected, Tolerance(1e-4, 0))
    assert not check.passed and check.max_rel == pytest.approx(1.0, rel=1e-3)
    actual[2], actual[3] = 1e-6, 0.0  # NaN only on one side
    assert not compare_tensors("y", actual, expected, Tolerance(1, 1)).passed
    check = compare_tensors("y", actual[:2], expected, Tolerance(1, 1))
    assert not check.passed and "shape" in check.note
    assert not compare_tensors("i", torch.tensor([1, 2]), torch.tensor([1, 3]),
                               tolerance("medium", torch.int64)).passed


# --- compare ---------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["highest", "medium"])
@pytest.mark.parametrize("train", [False, True], ids=["inference", "train"])
def test_compare_mlp(precision, train):
    model, inputs = mlp()
    before = copy.deepcopy(model.state_dict())
    report = compare(model, inputs, reference="cpu", precision=precision, train=train)
    assert report.passed, report
    assert report.precision == precision and report.reference == "cpu"
    names = [c.name for c in report.checks]
    assert names[0] == "output"
    assert ("grad.0.weight" in names) == train
    worst = max(c.rel_max_abs for c in report.checks)
    if precision == "medium":
        assert worst > 1e-4, report  # the bf16 emulation is in force
    else:
        assert worst < 1e-5, report
    for name, value in model.state_dict().items():  # the caller's model is untouched
        assert torch.equal(value, before[name]), name
    assert all(p.grad is None for p in model.parameters())


def test_compare_function_gradients_of_inputs():
    def fn(x, w):
        return torch.softmax(x @ w, dim=-1), (x * 2).sum()

    x, w = torch.randn(4, 8), torch.randn(8, 3)
    report = compare(fn, (x, w), reference="cpu", precision="highest", train=True)
    assert report.passed, report
    assert [c.name for c in report.checks] == ["output[0]", "output[1]", "grad.input[0]",
                                               "grad.input[1]"]


def test_precision_settings_are_restored():
    def settings():
        return (torchtpu_compile.config.matmul_precision, torch.get_float32_matmul_precision(),
                torch.backends.cuda.matmul.fp32_precision,
                torch.backends.mkldnn.matmul.fp32_precision)

    # Left at "none" when the user never set them: torchtpu would otherwise take "highest" for
    # the user's choice.
    before = settings()
    compare(*mlp(), reference="cpu", precision="medium")
    assert settings() == before


@pytest.mark.parametrize("name, precision, train", [("gpt2", "highest", True),
                                                    ("vit", "medium", False)])
def test_compare_transformer(name, precision, train):
    model, inputs = zoo.TRANSFORMERS[name]()
    report = compare(model, inputs, reference="auto", precision=precision, train=train)
    assert report.passed, report
    assert report.fallback_ops == {}
    assert report.checks[0].name == "output.logits"
    if train:
        assert len([c for c in report.checks if c.name.startswith("grad.")]) > 20


def test_reference_must_exist():
    with pytest.raises(ValueError, match="expected 'auto', 'cuda' or 'cpu'"):
        compare(*mlp(), reference="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            compare(*mlp(), reference="cuda")


# --- locate ----------------------------------------------------------------------------------

@pytest.mark.parametrize("train", [False, True], ids=["inference", "train"])
def test_planted_divergence_is_located(tanh_one_percent_high, train):
    model, inputs = planted()
    report = compare(model, inputs, reference="cpu", precision="highest", train=train,
                     locate=True)
    assert not report.passed
    assert "output" in [c.name for c in report.failures]
    found = report.divergence
    assert found is not None, report
    assert found.op == "aten.tanh.default"
    assert found.graph.startswith("forward" if train else "inference")
    assert found.inputs == ["float32[4, 32]"] and found.outputs == ["float32[4, 32]"]
    assert found.check.rel_max_abs == pytest.approx(0.01, rel=0.05)
    assert found.source_line.startswith(f"{__file__}:{PLANTED_LINE}: h = torch.tanh(h)")
    text = str(report)
    assert "FAILED" in text and "aten.tanh.default" in text and f":{PLANTED_LINE}:" in text


def test_locate_runs_only_on_failure():
    report = compare(*planted(), reference="cpu", precision="highest", locate=True)
    assert report.passed and report.divergence is None and report.locate_note is None


def test_locate_without_a_single_bad_op():
    from torchtpu_compile.numerics.locate import locate_divergence
    model, inputs = mlp()
    divergence, note = locate_divergence(model, inputs, torch.device("cpu"), "medium",
                                         train=False, cotangents={})
    assert divergence is None
    assert "none diverges beyond tolerance on its own" in note


class TiedQueries(nn.Module):
    """RT-DETR's query selection in small: the top 30 of 84 scores, all equal at this init
    (as RT-DETR v2's at random init, eval mode: its features collapse to ~1e-9 and every
    score rounds to the class bias, -log 2)."""

    def __init__(self, tied: bool):
        super().__init__()
        self.score = nn.Linear(4, 1)
        if tied:
            nn.init.zeros_(self.score.weight)

    def forward(self, x):
        index = self.score(x).squeeze(-1).topk(30, dim=1).indices
        return x.gather(1, index.unsqueeze(-1).expand(-1, -1, 4))  # the queries' boxes


def tied_queries(tied=True):
    torch.manual_seed(0)
    return TiedQueries(tied), (torch.randn(3, 84, 4),)


def test_locate_names_an_op_that_chose_other_equal_values():
    # Eager's topk takes 56, 83, 81, ... of 84 equal scores, torchtpu's 0, 1, 2, ...: both
    # right (torch.topk's docs leave ties unspecified), yet the gathered boxes differ.
    report = compare(*tied_queries(), reference="cpu", precision="highest", locate=True)
    assert not report.passed
    found = report.divergence
    assert found is not None and found.op == "aten.topk.default" and found.ties == 90, report
    assert "from ties" in str(report) and "leaves that choice unspecified" in str(report)
    assert "none diverges beyond tolerance on its own" in report.locate_note
    assert compare(*tied_queries(tied=False), reference="cpu", precision="highest").passed


@pytest.fixture
def tanh_decomposed_one_percent_high(monkeypatch):
    """Our decomposition table gives aten.tanh a decomposition 1% too large."""
    from torchtpu_compile.lower import decompositions

    def tanh(x):
        return (1 - 2 / (torch.exp(2 * x) + 1)) * 1.01
    monkeypatch.setitem(decompositions.OURS, aten.tanh.default, tanh)
    # Graphs cached by earlier tests, decomposed without the plant, must not answer for it.
    with torchtpu_compile.config.patch(graph_cache=False):
        yield


@pytest.mark.parametrize("train", [False, True], ids=["inference", "train"])
def test_a_wrong_decomposition_is_located_at_its_op(tanh_decomposed_one_percent_high, train):
    # The captured graphs used to hold our decompositions' ops, which eager then replayed too:
    # a wrong decomposition was invisible. Ours are checked whole, against eager's kernel.
    report = compare(*planted(), reference="cpu", precision="highest", train=train,
                     locate=True)
    found = report.divergence
    assert found is not None and found.op == "aten.tanh.default" and not found.ties, report
    assert found.check.rel_max_abs == pytest.approx(0.01, rel=0.05)
    assert found.source_line.startswith(f"{__file__}:{PLANTED_LINE}: h = torch.tanh(h)")


def test_assert_numerics_fixture(assert_numerics, tanh_one_percent_high):
    assert_numerics(*mlp(), reference="cpu", precision="medium")  # tanh off by 1% < 3e-2
    with pytest.raises(AssertionError) as info:
        assert_numerics(*planted(), reference="cpu", precision="highest")
    assert f"test_numerics.py:{PLANTED_LINE}" in str(info.value)


# --- the CLI and the pytest plugin, as a CI job runs them ---------------------------------------

FACTORIES = """
import torch, torch.nn as nn

def good():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)), (torch.randn(2, 8),)

def bad():
    # A stand-in for a broken lowering: torchtpu's tanh comes out 1% too large.
    import copy
    import torchtpu_compile
    import torchtpu_compile.lower.cache as program  # where compiled graphs are lowered
    torchtpu_compile.config.graph_cache = False  # no cached lowering may answer instead
    lower_graph = program.lower_graph
    def perturbed(gm, **kwargs):
        gm = copy.deepcopy(gm)
        for node in list(gm.graph.nodes):
            if node.target is torch.ops.aten.tanh.default:
                with gm.graph.inserting_after(node):
                    scaled = gm.graph.call_function(torch.ops.aten.mul.Tensor, (node, 1.01))
                scaled.meta["val"] = node.meta["val"]
                node.replace_all_uses_with(scaled, delete_user_cb=lambda u: u is not scaled)
        gm.recompile()
        return lower_graph(gm, **kwargs)
    program.lower_graph = perturbed
    return good()
"""


def run_in(tmp_path, *args):
    (tmp_path / "factories.py").write_text(FACTORIES)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


class CompilesAnotherProgram(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.linear(x)
        if torch.compiler.is_compiling():
            h = h + 0.5
        return torch.tanh(h)


def test_locate_says_when_the_captured_program_is_not_eagers():
    # A branch on is_compiling() makes Dynamo capture another program; no op of ours is wrong,
    # yet the note blamed rounding that "builds up over many ops".
    torch.manual_seed(0)
    report = compare(CompilesAnotherProgram(), (torch.randn(4, 8),), reference="cpu",
                     precision="highest", locate=True)
    assert not report.passed and report.divergence is None
    assert "already differ from eager in output" in report.locate_note, report.locate_note
    assert "builds up" not in report.locate_note
