"""Small helpers shared by the compile-path tests."""
from __future__ import annotations

import contextlib

import torch
import torch._dynamo

import torchtpu_compile


def compile_tpu(fn, **kwargs):
    """``torch.compile`` with our backend, after forgetting earlier Dynamo caches."""
    torch._dynamo.reset()
    return torch.compile(fn, backend="torchtpu", **kwargs)


#: The ways a program reaches the one lowering: torch.compile, the eager tpu device (strict,
#: and defer-and-fuse), and AOT artifacts (export, save, load).
PATHS = ("compile", "eager", "eager_fused", "aot")


@contextlib.contextmanager
def eager_mode(mode):
    """Run the eager tpu device in ``mode`` for a block, then restore the previous mode."""
    import torchtpu_eager  # noqa: F401  (registers torch.tpu)
    saved = torch.tpu.get_eager_mode()
    torch.tpu.set_eager_mode(mode)
    try:
        yield
    finally:
        torch.tpu.set_eager_mode(saved)


class _AsModule(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def run_on_path(path, fn, *args, tmp_dir=None):
    """``fn(*args)`` through one of ``PATHS``, strict (no fallback), fp32 matmuls; results as
    CPU tensors in ``fn``'s output structure. ``tmp_dir`` holds the AOT artifact.

    Example::

        got = run_on_path("eager", lambda x: x.argmax(), torch.randn(5))
    """
    import tempfile

    import torchtpu_eager  # noqa: F401  (the tpu device)
    from torch.utils import _pytree as pytree

    def to_cpu(out):
        return pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, out)

    with torchtpu_compile.config.patch(strict=True, matmul_precision="highest"):
        if path == "compile":
            return to_cpu(compile_tpu(fn)(*args))
        if path in ("eager", "eager_fused"):
            with eager_mode("strict" if path == "eager" else "defer_and_fuse"):
                return to_cpu(fn(*(a.to("tpu") for a in args)))
        if path == "aot":
            import torchtpu_compile.aot as aot
            with tempfile.TemporaryDirectory(dir=tmp_dir) as directory:
                saved = aot.compile(_AsModule(fn), args, precision="highest").save(
                    f"{directory}/program.tpu")
                return to_cpu(aot.load(saved)(*args))
    raise ValueError(f"unknown path {path!r}; one of {PATHS}")


def train_side_by_side(runs, x, y, steps: int, after_step=None) -> None:
    """Train each ``(model, optimizer[, scheduler])`` of ``runs`` for ``steps`` steps of an
    MSE loss between ``model(x)`` and ``y``, moved to the model's device; within each step the
    runs go one after the other, and ``after_step(i)`` is called after step ``i``.

    Example::

        train_side_by_side([(ref, opt_ref), (dev, opt_dev)], x, y, steps=3)
    """
    for i in range(steps):
        for model, optimizer, *scheduler in runs:
            device = next(model.parameters()).device
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
            for each in scheduler:
                each.step()
        if after_step is not None:
            after_step(i)
