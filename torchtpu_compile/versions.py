"""What a cached graph depends on besides itself: the stack's versions and our own code.

Cache keys above the executables include these, so that upgrading torch, torch-mlir or jaxlib,
or editing a decomposition or a lowering rule, never reuses an entry made by other code.

Example::

    stack_versions()                 # "torch-2.13.0+cpu|torch_mlir-20261001|jaxlib-0.10.2"
    source_digest("lower")           # sha256 over torchtpu_compile/lower/**/*.py
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


@functools.cache
def stack_versions() -> str:
    """torch, torch-mlir and jaxlib versions, as one string."""
    import jaxlib
    import torch
    try:
        mlir = importlib.metadata.version("torch-mlir")
    except importlib.metadata.PackageNotFoundError:
        mlir = "unknown"
    return f"torch-{torch.__version__}|torch_mlir-{mlir}|jaxlib-{jaxlib.__version__}"


@functools.cache
def source_digest(*parts: str, root: str = _PACKAGE_DIR) -> str:
    """SHA-256 over the Python sources of ``parts`` (files or folders of this package, or of
    the package at ``root``: a front end keys its own code this way).

    Hashing the source, not a hand-bumped version number, means no one has to remember to
    bump it: any edit to these files starts new cache entries.

    Example::

        source_digest(".", root=os.path.dirname(torchtpu_eager.__file__))  # a whole package
    """
    digest = hashlib.sha256()
    for part in sorted(parts):
        path = os.path.normpath(os.path.join(root, part))
        if os.path.isfile(path):
            files = [path]
        elif not os.path.isdir(path):
            # A renamed module must not silently drop out of the cache keys.
            raise FileNotFoundError(f"source_digest: {part!r} is not in {root}")
        else:
            files = sorted(os.path.join(root, name)
                           for root, _, names in os.walk(path) for name in names
                           if name.endswith(".py"))
        for file in files:
            digest.update(os.path.relpath(file, root).encode())
            with open(file, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()
