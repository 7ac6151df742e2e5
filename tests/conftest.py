import os

import pytest
import torch

import torchtpu_compile

# Defer-and-fuse compiles every recording at its first run in tests (and the processes they
# start): a test that runs its code once checks the fused program, not the per-op programs a
# recording runs by default until it is seen config.fuse_compile_at times
# (tests/test_fuse_tiers.py checks those tiers). Read when the mode is entered.
os.environ.setdefault("TORCHTPU_FUSE_COMPILE_AT", "1")

SLOW_FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow") + os.sep


def pytest_collection_modifyitems(config, items):
    """A slow test lives in tests/slow/ *and* carries ``@pytest.mark.slow`` (``make test`` leaves
    the folder out; ``-m "not slow"`` selects the same tests): a test with one and not the
    other is an error, so the two ways to tell cannot drift apart."""
    wrong = [item.nodeid for item in items if str(item.path).startswith(SLOW_FOLDER)
             != (item.get_closest_marker("slow") is not None)]
    if wrong:
        raise pytest.UsageError(
            "a test in tests/slow/ needs @pytest.mark.slow and a test marked slow belongs in "
            "tests/slow/; these do not: " + ", ".join(wrong[:10]))


@pytest.fixture(autouse=True)
def _own_counters():
    """Zero torchtpu's counters before each test: tests assert on process-wide counters
    (fallback_ops, compiles), and under xdist any earlier test in the worker may have moved them."""
    torchtpu_compile.reset_stats()


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
def defer_and_fuse():
    """The eager tpu device in defer-and-fuse mode, at "highest" matmul precision, for one test
    (a file takes it for all with ``pytestmark = pytest.mark.usefixtures("defer_and_fuse")``)."""
    import torchtpu_eager  # noqa: F401  (registers the device)
    saved = torch.tpu.get_eager_mode()
    torch.tpu.set_eager_mode("defer_and_fuse")
    with torchtpu_compile.config.patch(matmul_precision="highest"):
        yield
    torch.tpu.set_eager_mode(saved)


@pytest.fixture(params=["strict", "defer_and_fuse"])
def eager_mode(request):
    """The eager tpu device in mode ``request.param`` for one test, then the mode it was in: a
    test taking it runs strict and defer-and-fuse, or in the modes that
    ``@pytest.mark.parametrize("eager_mode", [...], indirect=True)`` names."""
    from tests.support.helpers import eager_mode as in_mode
    with in_mode(request.param):
        yield request.param


@pytest.fixture
def precision(request):
    """Set torchtpu_compile.config.matmul_precision (indirect parametrization) for one test."""
    with torchtpu_compile.config.patch(matmul_precision=request.param):
        yield request.param


@pytest.fixture(scope="session", autouse=True)
def session_compile_cache(tmp_path_factory):
    """Compile into a cache of this test session, not the user's ~/.cache/torchtpu.

    Every run then starts cold, as CI does. ``TORCHTPU_TEST_CACHE_DIR`` names a folder to use
    instead, kept between runs: ``make test-warm`` fills it in one run and judges a second,
    warm one (a warm start must never change a result). The variable serves this process (the
    setting reads it while no code sets it) and the subprocesses, which inherit it.
    """
    directory = os.environ.get("TORCHTPU_TEST_CACHE_DIR")
    if directory:
        directory = os.path.abspath(directory)
        os.makedirs(directory, mode=0o700, exist_ok=True)
    else:
        directory = str(tmp_path_factory.mktemp("torchtpu-cache"))
    saved_env = os.environ.get("TORCHTPU_CACHE_DIR")
    os.environ["TORCHTPU_CACHE_DIR"] = directory
    assert torchtpu_compile.config.cache_dir == directory, "a test module set cache_dir"
    yield directory
    if saved_env is None:
        os.environ.pop("TORCHTPU_CACHE_DIR", None)
    else:
        os.environ["TORCHTPU_CACHE_DIR"] = saved_env
