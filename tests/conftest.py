import pytest
import torch

import torchtpu_compile


@pytest.fixture
def fresh_dynamo():
    """Forget Dynamo's caches and zero torchtpu's counters.

    transformers models share wrapper code objects; without a reset, later models hit Dynamo's
    recompile limit and silently run eagerly.
    """
    torch._dynamo.reset()
    torchtpu_compile.reset_stats()
    yield
    torch._dynamo.reset()


@pytest.fixture
def precision(request):
    """Set torchtpu_compile.config.matmul_precision (indirect parametrization) for one test."""
    saved = torchtpu_compile.config.matmul_precision
    torchtpu_compile.config.matmul_precision = request.param
    yield request.param
    torchtpu_compile.config.matmul_precision = saved
