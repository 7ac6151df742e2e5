"""Cholesky as eager's LAPACK computes it: the triangle read, the info, the error raised."""
import warnings

import pytest
import torch

from tests.support.helpers import run_on_path

PATHS = ("compile", "eager", "eager_fused")


@pytest.mark.parametrize("path", PATHS)
def test_the_upper_factor_reads_the_upper_triangle(path):
    # Eager factors U^T U = A from A's upper triangle; ours read the lower one, so a matrix
    # stored as its upper triangle gave a diagonal factor (others: NaN, or no error).
    a = torch.tensor([[4.0, 2, 0], [2, 5, 1], [0, 1, 3]], dtype=torch.float64).triu()

    def factors(a):
        return torch.linalg.cholesky_ex(a, upper=True), torch.linalg.cholesky(a, upper=True)

    torch.testing.assert_close(run_on_path(path, factors, a), factors(a))


@pytest.mark.parametrize("path", PATHS)
def test_info_comes_from_the_lower_triangle(path):
    # The pivot search ran on the whole matrix: a lower triangle that is not positive definite
    # under a different upper one gave info 0 beside a NaN factor, and cholesky raised nothing.
    a = torch.tensor([[1.0, 0, 0], [2, 1, 0], [0, 0, 1]])
    assert run_on_path(path, lambda a: torch.linalg.cholesky_ex(a).info, a).item() == 2
    with pytest.raises(torch.linalg.LinAlgError, match="leading minor of order 2"):
        run_on_path(path, torch.linalg.cholesky, a)


@pytest.mark.parametrize("path", PATHS)
def test_deprecated_cholesky_raises_as_eager(path):
    # torch.cholesky dropped the info: a matrix that is not positive definite gave NaN.
    bad = torch.tensor([[1.0, 2, 0], [2, 1, 0], [0, 0, 1]])
    good = bad @ bad.mT + torch.eye(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.cholesky is deprecated
        for a in (bad, bad.expand(2, 3, 3)):
            with pytest.raises(torch.linalg.LinAlgError) as raised:
                torch.cholesky(a)
            with pytest.raises(torch.linalg.LinAlgError, match=raised.value.args[0]
                               .replace("(", r"\(").replace(")", r"\)")):
                run_on_path(path, torch.cholesky, a)
        for upper in (False, True):
            torch.testing.assert_close(
                run_on_path(path, lambda a, upper=upper: torch.cholesky(a, upper=upper), good),
                torch.cholesky(good, upper=upper))
