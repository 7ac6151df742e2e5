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
