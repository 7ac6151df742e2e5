"""A fast subset of PyTorch's ModuleInfo database (``module_db``) on each path, against eager
CPU, in fp32: forward outputs, gradients of parameters and inputs, and the module's state after
the call (tests/support/opinfo/modules.py).

The whole sweep is tests/slow/test_modinfo_full.py. Entries here span linear and convolution
layers, normalization (running statistics mutated in training), pooling with indices and lazy
modules. Each passes on its path with its first samples: an entry that starts falling back to
eager PyTorch, or is skipped, fails here.
"""
from __future__ import annotations

import pytest

from torchtpu_compile import config
from tests.support.opinfo.modules import KNOWN_FAILURES, check_module, module_entries
from tests.support.opinfo.paths import PATHS
from tests.support.opinfo.skips import MODULE_SKIPS
from tests.support.opinfo.verdict import assert_passes

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

FAST = {
    "compile": ["nn.Linear", "nn.Conv2d", "nn.LayerNorm", "nn.AdaptiveMaxPool2d"],
    # BatchNorm2d: running statistics mutated in training; LazyConv1d: moved before its first
    # forward initializes it.
    "eager": ["nn.Linear", "nn.BatchNorm2d", "nn.LazyConv1d", "nn.AdaptiveMaxPool2d"],
    # Defer-and-fuse: forward and backward recorded as one program, the running statistics
    # written inside it and read after it ran.
    "fuse": ["nn.Linear", "nn.BatchNorm2d"],
}

MODULES = module_entries()


@pytest.mark.parametrize("path, entry", [(p, e) for p, es in FAST.items() for e in es])
def test_module_fp32(entry, path):
    with config.patch(matmul_precision="highest"):
        result = check_module(MODULES[entry], path, max_samples=2)
    assert_passes(result)


def test_lists_name_real_entries():
    assert not {e for es in FAST.values() for e in es} - set(MODULES)
    assert not set(MODULE_SKIPS) - set(MODULES), "MODULE_SKIPS names unknown entries"
    assert not {e for e, _ in KNOWN_FAILURES} - set(MODULES)
    for (entry, path), reason in KNOWN_FAILURES.items():
        assert path in PATHS and len(reason) > 20, entry
