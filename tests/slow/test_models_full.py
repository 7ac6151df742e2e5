"""The long sweep behind test_models.py: every model under "medium", and more training steps.

More steps let a small error (a gradient off in one layer, a state update lost between calls)
compound into a visible loss difference.
"""
from __future__ import annotations

import pytest

from tests.support import zoo
from tests.support.model_checks import check_model
from tests.test_models import SMALL

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_dynamo")]

MODELS = {**SMALL, **zoo.TRANSFORMERS}


@pytest.mark.parametrize("precision", ["medium"], indirect=True)
@pytest.mark.parametrize("name", list(MODELS))
def test_medium(precision, name):
    model, inputs = MODELS[name]()
    check_model(name, model, inputs, precision, steps=5)


@pytest.mark.parametrize("precision", ["highest"], indirect=True)
@pytest.mark.parametrize("name", list(zoo.TRANSFORMERS))
def test_highest_long(precision, name):
    model, inputs = MODELS[name]()
    check_model(name, model, inputs, precision, steps=8)
