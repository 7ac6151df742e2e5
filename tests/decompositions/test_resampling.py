"""The resampling decompositions (torchtpu_compile/lower/decompositions/resampling.py) against
eager CPU PyTorch, in strict mode: the op must run through XLA, not fall back, and give eager's
numbers (borders, pixel centres, scales)."""
from __future__ import annotations

import pytest
import torch

from tests.support.decomposition_checks import aten, check, check_on_both_paths, randn
from torchtpu_compile import config

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


# --- upsampling ------------------------------------------------------------------------------

def test_upsample_output_size_overloads():
    # The eager tpu device meets these overloads (interpolate's .vec is resolved before
    # dispatch); they fell back to the host there. Strict: a fallback is an error.
    aten = torch.ops.aten
    x, v = randn(2, 3, 4, 5), randn(1, 2, 3, 4, 5)
    check(lambda x, v: [out for corners in (False, True) for out in (
        aten.upsample_bilinear2d.default(x, [7, 9], corners),
        aten.upsample_bicubic2d.default(x, [7, 9], corners, 1.5, None),
        aten.upsample_trilinear3d.default(v, [4, 5, 7], corners))], x, v)
    with config.patch(strict=True, matmul_precision="highest"):
        actual = torch.nn.functional.interpolate(x.to("tpu"), (7, 9), mode="bicubic").cpu()
    torch.testing.assert_close(actual, torch.nn.functional.interpolate(x, (7, 9), mode="bicubic"),
                               rtol=1e-4, atol=1e-5)


NEAREST_CASES = [(3, 7, 2.5), (3, 7, None), (4, 8, 2.0), (5, 3, 0.6), (7, 7, 1.3), (3, 10, 3.3)]


def check_nearest_upsampling_backward(dims_list=(1, 2, 3), cases=NEAREST_CASES):
    # Unlowered with scales: every nearest interpolation's backward on the eager device (RT-DETR's
    # FPN) ran on the host. Eager's source positions: float32 arithmetic, 1 / the scale given
    # (else in / out), in == out and out == 2 in as shortcuts (not for the exact variant).
    grads, calls = [], []
    for exact in (False, True):
        for dims in dims_list:
            name = ("_upsample_nearest_exact%dd_backward" if exact else
                    "upsample_nearest%dd_backward") % dims
            for n_in, n_out, scale in cases:
                out_size = [n_out + d for d in range(dims)]
                in_size = [2, 3] + [n_in + d for d in range(dims)]
                calls.append((getattr(aten, name).default, out_size, in_size, [scale] * dims))
                grads.append(randn(2, 3, *out_size, seed=len(grads)))

    def backwards(*grads):
        return [op(g, out_size, in_size, *scales)
                for (op, out_size, in_size, scales), g in zip(calls, grads)]
    check_on_both_paths(backwards, *grads, rtol=1e-5, atol=1e-5)


def test_nearest_upsampling_backward_with_and_without_scales():
    # 2-d, three cases here (a scale, no scale, the out == 2 in shortcut); every case at every
    # rank in tests/slow/test_resampling_full.py
    check_nearest_upsampling_backward(dims_list=(2,),
                                      cases=[(3, 7, 2.5), (5, 3, None), (4, 8, 2.0)])


LINEAR_CASES = [(3, 7, 2.5), (3, 7, None), (4, 8, 2.0), (5, 3, 0.6), (7, 7, 1.3), (3, 10, 3.3),
                (1, 4, None), (4, 1, None)]  # (size in, size out, scale)


def check_linear_upsampling_backward(dims_list=(1, 2, 3), cases=LINEAR_CASES):
    # Unlowered: every linear, bilinear and trilinear interpolation's backward on the eager
    # device (Segformer's decoder, any UNet) ran on the host. Eager's sources and weights:
    # float32 arithmetic, 1 / the scale given (else in / out) or (in - 1) / (out - 1) with
    # align_corners, positions clamped at 0, equal sizes copied.
    names = {1: "upsample_linear1d_backward", 2: "upsample_bilinear2d_backward",
             3: "upsample_trilinear3d_backward"}
    grads, calls = [], []
    for corners in (False, True):
        for dims in dims_list:
            for n_in, n_out, scale in cases:
                out_size = [n_out + d for d in range(dims)]
                in_size = [2, 3] + [n_in + d for d in range(dims)]
                calls.append((getattr(aten, names[dims]).default, out_size, in_size, corners,
                              [scale] * dims))
                grads.append(randn(2, 3, *out_size, seed=len(grads)))

    def backwards(*grads):
        return [op(g, out_size, in_size, corners, *scales)
                for (op, out_size, in_size, corners, scales), g in zip(calls, grads)]
    check_on_both_paths(backwards, *grads, rtol=1e-5, atol=1e-5)


def test_bilinear_upsampling_backward_with_and_without_scales():
    # 2-d, three cases here (a scale, no scale, one output); every case at every rank in
    # tests/slow/test_resampling_full.py
    check_linear_upsampling_backward(dims_list=(2,), cases=[(3, 7, 2.5), (5, 3, None),
                                                            (4, 1, None)])


def check_bicubic_upsampling_backward(cases=LINEAR_CASES):
    # Unlowered: bicubic interpolation's backward (ViT-style position embeddings resized to
    # another image size) ran on the host. Eager's taps: four per dim, the position unclamped
    # (it may fall before 0), each source clamped into the input, A = -0.75.
    grads, calls = [], []
    for corners in (False, True):
        for n_in, n_out, scale in cases:
            out_size, in_size = [n_out, n_out + 2], [2, 3, n_in, n_in + 1]
            calls.append((out_size, in_size, corners, [scale, scale]))
            grads.append(randn(2, 3, *out_size, seed=len(grads)))

    def backwards(*grads):
        return [aten.upsample_bicubic2d_backward.default(g, out_size, in_size, corners, *scales)
                for (out_size, in_size, corners, scales), g in zip(calls, grads)]
    check_on_both_paths(backwards, *grads, rtol=1e-5, atol=1e-5)


def test_bicubic_upsampling_backward_with_and_without_scales():
    # One case here (a scale, sources before 0); every case in tests/slow/test_resampling_full.py
    check_bicubic_upsampling_backward(cases=[(3, 7, 2.5)])


@pytest.mark.parametrize("op", ["upsample_linear1d_backward", "upsample_bilinear2d_backward",
                                "upsample_bicubic2d_backward", "_upsample_bilinear2d_aa_backward",
                                "_upsample_bicubic2d_aa_backward"])
def test_float64_upsampling_backward_has_float64_weights(op):
    # eager's opmath type for float64 is float64: its source positions and weights too
    # (they were float32, 3e-7 off in float64; fuzz seed 6086, the tpu device)
    dims = 1 if "1d" in op else 2
    out, size = [7, 5][:dims], [2, 3, *[5, 3][:dims]]
    grads = [randn(2, 3, *out, seed=k).double() for k in range(2)]

    def backward(*grads):
        call = getattr(aten, op).default
        return [call(g, out, size, corners, *([None] * dims))
                for g, corners in zip(grads, (False, True))]
    check_on_both_paths(backward, *grads, rtol=1e-12, atol=1e-12)


ANTIALIASED_SIZES = (dict(scale_factor=0.5), dict(size=(5, 20)), dict(size=(1, 1)))


def check_antialiased_upsampling(modes=("bilinear", "bicubic"), sizes=ANTIALIASED_SIZES):
    # interpolate(antialias=True) (torchvision's Resize on tensors) ran on the host on both
    # paths. Down and up, scales and sizes, both corner conventions; strict: no fallback.
    x = randn(2, 3, 16, 9)
    calls = [dict(mode=mode, align_corners=corners, **size)
             for mode in modes for corners in (False, True)
             for size in sizes]

    def interpolate(x):
        return [torch.nn.functional.interpolate(x, antialias=True, **kw) for kw in calls]
    check_on_both_paths(interpolate, x, rtol=1e-4, atol=1e-5)  # eager sums in another order


def test_antialiased_upsampling_runs_through_xla():
    # bilinear (torchvision's default) to a size that is down in rows and up in columns;
    # bicubic, scales and the size of one in tests/slow/test_resampling_full.py
    check_antialiased_upsampling(modes=("bilinear",), sizes=ANTIALIASED_SIZES[1:2])


ANTIALIASED_BACKWARD_SIZES = [([16, 3], [8, 3], None), ([16, 9], [5, 20], None),
                              ([7, 9], [1, 1], None), ([16, 9], [8, 4], (0.5, 0.5))]


def check_antialiased_upsampling_backward(modes=("bilinear", "bicubic"),
                                          sizes=ANTIALIASED_BACKWARD_SIZES):
    # _upsample_*2d_aa_backward ran on the host on both paths. Down (16 -> 8 rows with
    # align_corners once summed into the wrong rows), up, to one, by a scale; strict.
    ops = [getattr(aten, f"_upsample_{mode}2d_aa_backward").default for mode in modes]

    def backward(*grads):
        return [op(g, out, [2, 3, *size], corners, *(scales or (None, None)))
                for op in ops
                for corners in (False, True)
                for g, (size, out, scales) in zip(grads, sizes)
                if not (corners and scales)]  # align_corners takes no scale
    grads = [randn(2, 3, *out, seed=k) for k, (_, out, _) in enumerate(sizes)]
    check_on_both_paths(backward, *grads, rtol=1e-4, atol=1e-5)  # eager sums in another order


def test_antialiased_upsampling_backward_runs_through_xla():
    # The rows case that once summed into the wrong rows, and a scale, bilinear; every mode
    # and size in tests/slow/test_resampling_full.py
    check_antialiased_upsampling_backward(
        modes=("bilinear",), sizes=[ANTIALIASED_BACKWARD_SIZES[0], ANTIALIASED_BACKWARD_SIZES[3]])


# --- grid sampling ---------------------------------------------------------------------------

def check_grid_sampler_backward(paddings=(0, 1, 2)):
    # Unlowered: training deformable attention (RT-DETR, Deformable DETR: grid_sample,
    # bilinear, zeros) ran it in eager PyTorch, a host round trip per layer and step. The
    # grid hits borders, pixel centres and edges of both conventions, and lies outside.
    x = randn(2, 3, 5, 7)
    marks = torch.tensor([-1.0, 1, 0, -1.5, 1.5, -1 + 1 / 7, 1 - 1 / 7, -1 + 2 / 7, 3, -3.2, 2])
    special = torch.stack(torch.meshgrid(marks, marks, indexing="xy"), -1)
    grid = torch.cat([special.expand(2, -1, -1, -1), randn(2, 11, 4, 2) * 1.5], 2)
    grad = randn(2, 3, 11, 15, seed=1)

    def backwards(grad, x, grid):
        out = [aten.grid_sampler_2d_backward.default(grad, x, grid, mode, padding, align,
                                                     [True, True])
               for mode in (0, 1) for padding in paddings for align in (False, True)]
        return out + [aten.grid_sampler_2d_backward.default(grad, x, grid, 0, 0, False,
                                                            [False, True])[1]]
    check_on_both_paths(backwards, grad, x, grid, rtol=1e-5, atol=1e-5)


def test_grid_sampler_backward_every_mode_at_borders_and_pixel_centres():
    # zeros padding (deformable attention's); border and reflection padding in
    # tests/slow/test_resampling_full.py
    check_grid_sampler_backward(paddings=(0,))


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_uint8_resize_on_the_device_equals_eagers(align_corners, mode):
    # Eager's uint8 kernel interpolates in fixed point, one axis at a time; the float
    # decomposition was 1 off on a third of the pixels (216 of 780 at 21x26 -> 10x13). (The
    # compile path traces PyTorch's own decomposition of the .vec overload, as aot_eager does.)
    image = (torch.rand(2, 3, 21, 26, generator=torch.Generator().manual_seed(0)) * 255).to(
        torch.uint8)
    for size in ((10, 13), (42, 52)):
        want = torch.nn.functional.interpolate(image, size=size, mode=mode,
                                               align_corners=align_corners)
        got = torch.nn.functional.interpolate(image.to("tpu"), size=size, mode=mode,
                                              align_corners=align_corners)
        assert torch.equal(got.cpu(), want)
