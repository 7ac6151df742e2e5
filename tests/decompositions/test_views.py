"""The view decompositions (torchtpu_compile/lower/decompositions/views.py) against eager CPU
PyTorch, in strict mode: the op must run through XLA, not fall back, and give eager's numbers."""
from __future__ import annotations

import pytest
import torch

from tests.support.decomposition_checks import check, check_on_both_paths, randn

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


# --- copies of views -------------------------------------------------------------------------

def test_view_copy_and_unbind_copy():
    x = randn(5, 6)
    check(lambda x: torch.ops.aten.view_copy(x, [3, 10]), x)
    check(lambda x: torch.ops.aten.unbind_copy(x, 1), x)


# --- strided views ---------------------------------------------------------------------------

def test_as_strided_of_a_computed_tensor():
    # torch-mlir lowers as_strided through a constant XLA rejects; group_norm emits it.
    check(lambda x: torch.as_strided(x + 1, (3, 2), (1, 3), 1), randn(12))
    check(lambda x: torch.as_strided(x * 2, (4, 3), (3, 1)), randn(12))


def test_as_strided_scatter():
    check(lambda x, s: torch.as_strided_scatter(x * 1, s, (3, 2), (1, 3), 1), randn(12),
          randn(3, 2, seed=1))


# --- diagonals -------------------------------------------------------------------------------

@pytest.mark.parametrize("offset, dim1, dim2", [(0, 0, 1), (1, 0, 1), (-2, 1, 0), (3, 1, 2),
                                                 (9, 0, 1)])
def test_diagonal_and_diagonal_scatter(offset, dim1, dim2):
    x = randn(4, 6, 5)
    check(lambda x: torch.diagonal(x, offset, dim1, dim2) * 2, x)
    src = torch.diagonal(x, offset, dim1, dim2).clone() + 1
    check(lambda x, s: torch.diagonal_scatter(x, s, offset, dim1, dim2), x, src)


def test_diag_of_a_matrix():
    check(lambda x: torch.diag(x, -1), randn(5, 6))


# --- windows and rolls -----------------------------------------------------------------------

@pytest.mark.parametrize("dim, size, step", [(1, 2, 2), (0, 3, 1), (-1, 3, 2)])
def test_unfold_windows(dim, size, step):
    check(lambda x: x.unfold(dim, size, step) + 1, randn(5, 4, 6))


@pytest.mark.parametrize("shifts, dims", [(2, 0), ((-1, 7), (1, 2)), (3, ()), (0, 1)])
def test_roll(shifts, dims):
    check(lambda x: torch.roll(x, shifts, dims), randn(5, 4, 3))


@pytest.mark.parametrize("shape, padding", [((2, 3, 5), (2, 1)), ((1, 2, 4, 3), (1, 3, 2, 0)),
                                            ((2, 3, 2, 4), (1, 2, 0, 1, 3, 1))],
                         ids=["1d", "2d", "3d"])
def test_replication_pad_backward(shape, padding):
    # torch-mlir does not lower replication_pad{1,2,3}d_backward: nn.ReplicationPad*d trained
    # in eager PyTorch. Left and right pads of several widths, a dim left unpadded.
    x = randn(*shape)
    out = torch.nn.functional.pad(x, padding, mode="replicate")
    grad = randn(*out.shape, seed=1)
    backward = getattr(torch.ops.aten, f"replication_pad{len(padding) // 2}d_backward")
    check_on_both_paths(lambda g, x: backward(g, x, list(padding)), grad, x, rtol=1e-6, atol=1e-6)
