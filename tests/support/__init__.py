"""Code the tests share and nothing else: no test lives here.

- ``helpers``: ``compile_tpu``, the paths a program reaches XLA by, eager-mode switching;
- ``model_checks``: a model trained compiled and eagerly, compared with tolerances;
- ``zoo``, ``zoo_full``, ``zoo_check``: the model zoo and its check;
- ``dynamic_models``, ``aot_factories``: models for the bucket and AOT tests;
- ``decomposition_checks``: one decomposition against eager, on every path;
- ``dist_launch``, ``dist_workers``, ``dist_fsdp``: tpu_dist worker processes;
- ``checkpoint_worker``: activation checkpointing, run in a subprocess;
- ``fuzz``: small random programs compared with eager CPU on every path (differential fuzzing);
- ``opinfo``: PyTorch's OpInfo and ModuleInfo databases run on both paths (harnesses, sweep,
  coverage report).

Tests import it as ``from tests.support import helpers``; a subprocess that imports it needs
``python_env()``.
"""
from __future__ import annotations

import os

#: The repository root: on ``sys.path``, it makes ``tests.support`` importable.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def python_env(**extra: str) -> dict:
    """This process's environment, with the repository root first on ``PYTHONPATH``, so that a
    child Python can ``import tests.support...``; ``extra`` variables are set on top.

    Example::

        subprocess.run([sys.executable, "-m", "tests.support.dist_workers", ...],
                       env=python_env(PYTHONUNBUFFERED="1"))
    """
    paths = [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, **extra, "PYTHONPATH": os.pathsep.join(paths)}
