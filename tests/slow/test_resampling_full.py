"""The resampling backwards of tests/decompositions/test_resampling.py over every variant:
nearest and linear upsampling's 1-d and 3-d forms (linear and bicubic: every case) and the grid
sampler's border and reflection padding (the fast suite runs 2-d and zeros padding), and
antialiased resampling in both modes at every size (the fast suite runs bilinear)."""
import pytest

from tests.decompositions.test_resampling import (check_antialiased_upsampling,
                                                  check_antialiased_upsampling_backward,
                                                  check_bicubic_upsampling_backward,
                                                  check_grid_sampler_backward,
                                                  check_linear_upsampling_backward,
                                                  check_nearest_upsampling_backward)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_dynamo")]


def test_nearest_upsampling_backward_every_rank():
    check_nearest_upsampling_backward(dims_list=(1, 2, 3))


def test_linear_upsampling_backward_every_rank():
    check_linear_upsampling_backward(dims_list=(1, 2, 3))


def test_bicubic_upsampling_backward_every_case():
    check_bicubic_upsampling_backward()


def test_grid_sampler_backward_every_padding():
    check_grid_sampler_backward(paddings=(0, 1, 2))


def test_antialiased_upsampling_every_mode():
    check_antialiased_upsampling(modes=("bilinear", "bicubic"))


def test_antialiased_upsampling_backward_every_mode_and_size():
    check_antialiased_upsampling_backward(modes=("bilinear", "bicubic"))
