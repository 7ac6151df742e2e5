"""The native extension, ``torchtpu_compile._native`` (``torchtpu_compile/csrc/native.cpp``):
the tpu device guard, hooks with pinned host memory and the tpu generator, and tpu
allocations for the profiler -- what PyTorch only accepts from C++. Everything else is in
pyproject.toml.

Built against the installed torch with the system C++ compiler, so the build needs torch
first and no build isolation (``make install``: ``pip install --no-build-isolation -e .``).
"""
import os

from setuptools import setup

# Importing torch autoloads an installed torchtpu, which needs the extension this builds: a
# rebuild (a changed native.cpp, a checkout without the .so) would fail on itself.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402

setup(
    ext_modules=[CppExtension("torchtpu_compile._native", ["torchtpu_compile/csrc/native.cpp"],
                              extra_compile_args=["-O2"])],
    # ninja is not a dependency: the plain setuptools compiler runs the one file.
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
)
