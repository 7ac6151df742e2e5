"""Where eager PyTorch raises, we raise: PyTorch's own error inputs (OpInfo's ``error_inputs``,
ModuleInfo's ``module_error_inputs_func``) of a few representative entries on both paths
(tests/support/opinfo/errors.py). The whole sweep is ``python -m tests.support.opinfo.sweep
--errors`` (docs/coverage.md).

Entries here span shape checks (cat, view, conv2d), index checks (gather, scatter), argument
checks held in meta kernels (roll, avg_pool2d, diagonal_copy, kthvalue), checks held only in
eager's kernels (index_add, as_strided_scatter, NLLLoss's weight dtype) and module inputs. No
input may be accepted where eager raises (``returns-value``) or raise another type
(``other-error``); ``dynamo`` (Dynamo itself does the same with ``backend="eager"``) is allowed.
"""
from __future__ import annotations

import pytest

from tests.support.opinfo import errors
from tests.support.opinfo.harness import entry_name
from tests.support.opinfo.modules import module_entries

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

OPS = ["cat", "view", "nn.functional.conv2d", "gather", "scatter", "roll",
       "nn.functional.avg_pool2d", "diagonal_copy", "kthvalue", "index_add", "as_strided_scatter",
       "bucketize"]
MODULES = ["nn.NLLLoss", "nn.Embedding", "nn.BatchNorm2d"]


def _op_db() -> dict:
    from torch.testing._internal.common_methods_invocations import op_db
    return {entry_name(op): op for op in op_db}


def _assert_raises_as_eager(result):
    bad = {v: n for v, n in result.verdicts.items() if v in ("returns-value", "other-error")}
    assert not bad, f"{result.op} on {result.path}: {bad}: {result.detail}"
    assert result.samples > 0, f"{result.op}: no error input ran ({result.detail})"


@pytest.mark.parametrize("path", ["compile", "eager"])
@pytest.mark.parametrize("entry", OPS)
def test_op_error_inputs_raise_as_eager(entry, path):
    _assert_raises_as_eager(errors.check_errors(_op_db()[entry], path))


@pytest.mark.parametrize("path", ["compile", "eager"])
@pytest.mark.parametrize("entry", MODULES)
def test_module_error_inputs_raise_as_eager(entry, path):
    _assert_raises_as_eager(errors.check_module_errors(module_entries()[entry], path))


def test_dynamos_wrappers_are_judged_by_what_they_wrap():
    from torch._dynamo.exc import TorchRuntimeError
    from torchtpu_compile.errors import LoweringError
    wrapped = TorchRuntimeError("fake tensor call")
    wrapped.__cause__ = IndexError("dim")
    assert errors.matches(errors.Raised(wrapped), IndexError)
    # Dynamo keeps only the message of the fake tensor's error at times.
    quoted = TorchRuntimeError("...: got ValueError('cat expects at least one tensor')")
    assert errors.matches(errors.Raised(quoted), ValueError)
    assert not errors.matches(errors.Raised(quoted), IndexError)
    # A lowering failure of ours is a RuntimeError, but no rejection of the input.
    assert not errors.matches(errors.Raised(LoweringError("cannot lower")), RuntimeError)
    assert not errors.matches(errors.Raised(None), RuntimeError)


def test_an_entry_is_as_bad_as_its_worst_input():
    result = errors.ErrorResult("op", "eager", "fp32", "pass")
    notes: list = []
    for verdict in ("pass", "other-error", "returns-value", "cpu-specific"):
        errors._record(result, notes, "input", verdict)
    errors._conclude(result, 0.0, notes)
    assert result.status == "returns-value" and result.samples == 3
    assert errors.totals([result.to_json()]) == {"eager": {
        "pass": 1, "other-error": 1, "returns-value": 1, "cpu-specific": 1}}


def test_bucketize_names_boundaries_that_are_not_one_dimensional():
    # Compiled, the batched search behind it raised a gather's shape error instead.
    import torch

    from tests.support.helpers import compile_tpu
    values, boundaries = torch.tensor([1.0]), torch.tensor([[1.0, 2.0]])
    with pytest.raises(RuntimeError, match=r"boundaries tensor must be 1 dimension, but got "
                                           r"dim\(2\)"):
        compile_tpu(torch.bucketize)(values, boundaries)
