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


@pytest.fixture(scope="session", autouse=True)
def session_compile_cache(tmp_path_factory):
    """Compile into a cache of this test session, not the user's ~/.cache/torchtpu.

    Every run then starts cold, as CI does; subprocesses inherit it through the environment.
    """
    import os
    directory = str(tmp_path_factory.mktemp("torchtpu-cache"))
    saved_env = os.environ.get("TORCHTPU_CACHE_DIR")
    saved_config = torchtpu_compile.config.cache_dir
    os.environ["TORCHTPU_CACHE_DIR"] = directory
    torchtpu_compile.config.cache_dir = directory
    yield directory
    torchtpu_compile.config.cache_dir = saved_config
    if saved_env is None:
        os.environ.pop("TORCHTPU_CACHE_DIR", None)
    else:
        os.environ["TORCHTPU_CACHE_DIR"] = saved_env
