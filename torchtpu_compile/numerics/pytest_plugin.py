"""pytest plugin: the ``assert_numerics`` fixture, for a project's own tests.

Enable it with ``pytest -p torchtpu_compile.numerics.pytest_plugin``, or in the top-level
``conftest.py``: ``pytest_plugins = ["torchtpu_compile.numerics.pytest_plugin"]``. Then::

    def test_my_model_matches_eager(assert_numerics):
        model, x = make_model()
        assert_numerics(model, (x,), precision="highest", train=True)

On failure the test fails with the whole report, including the first op that diverges and its
source line. ``--torchtpu-reference`` and ``--torchtpu-precision`` set the defaults for a run.
"""
from __future__ import annotations

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("torchtpu", "torchtpu numerics")
    group.addoption("--torchtpu-reference", default="auto",
                    help="reference device for assert_numerics: auto (default), cuda or cpu")
    group.addoption("--torchtpu-precision", default=None, choices=("medium", "high", "highest"),
                    help="torchtpu matmul precision for assert_numerics (default: the mode in "
                         "force)")


@pytest.fixture
def assert_numerics(request):
    """``assert_numerics(model_or_fn, example_inputs, **compare_options)`` -> Report.

    Runs ``torchtpu_compile.numerics.compare`` (with ``locate=True``) and fails the test with
    the report when anything is beyond tolerance.
    """
    from .comparison import assert_numerics as check

    defaults = {"reference": request.config.getoption("--torchtpu-reference", default="auto"),
                "precision": request.config.getoption("--torchtpu-precision", default=None)}

    def run(model_or_fn, example_inputs, **options):
        __tracebackhide__ = True
        return check(model_or_fn, example_inputs, **{**defaults, **options})

    return run
