"""The native extension, ``torchtpu_compile._native`` (``torchtpu_compile/csrc/native.cpp``):
the tpu device guard, hooks with pinned host memory, and tpu allocations for the profiler --
what PyTorch only accepts from C++. Everything else is in pyproject.toml.

Built against the installed torch with the system C++ compiler, so the build needs torch
first and no build isolation (``make install``: ``pip install --no-build-isolation -e .``).
"""
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    ext_modules=[CppExtension("torchtpu_compile._native", ["torchtpu_compile/csrc/native.cpp"],
                              extra_compile_args=["-O2"])],
    # ninja is not a dependency: the plain setuptools compiler runs the one file.
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
)
