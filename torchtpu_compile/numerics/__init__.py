"""Numerics: torchtpu against eager PyTorch on a reference device, down to the first op that
diverges.

Example::

    from torchtpu_compile.numerics import compare

    report = compare(model, (x,), reference="auto", precision="highest", train=True,
                     locate=True)
    print(report)             # per output and gradient: max abs/rel error, verdict
    assert report.passed, report

From the command line (exit status 1 on failure)::

    python -m torchtpu_compile.numerics mypkg.models:make_model --precision highest --locate

In pytest, with ``-p torchtpu_compile.numerics.pytest_plugin``, the ``assert_numerics``
fixture checks a model in one line. The tolerance policy and the precision modes are
described in docs/precision.md.
"""
from __future__ import annotations

import importlib

# Loaded on first use, so that the pytest plugin (a submodule) does not import torch at startup.
_EXPORTS = {
    "compare": ".comparison", "assert_numerics": ".comparison",
    "Report": ".report", "Divergence": ".report",
    "TensorCheck": ".policy", "Tolerance": ".policy", "tolerance": ".policy",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
