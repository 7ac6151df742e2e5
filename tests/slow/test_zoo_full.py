"""The model zoo (tests/support/zoo_full.py): every model compiled against eager, inference and
training, at matmul precision "highest"; and every model's forward and backward on the eager
tpu device against the CPU. Writes build/coverage/zoo.json for docs/coverage.md
(``make coverage``): per-model errors, tolerance, Dynamo graphs and breaks, fallback ops."""
from __future__ import annotations

import json
import os

import pytest
import torch

from tests.support import zoo, zoo_check, zoo_full

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_dynamo")]

# Parallel runs over parts of the zoo write separate files (build/coverage/zoo*.json all merge).
RESULTS = os.environ.get("TORCHTPU_ZOO_RESULTS", os.path.join("build", "coverage", "zoo.json"))


def _save(record: dict, results: str = RESULTS) -> None:
    """Merge one model's record into the results file now: a long run that is cut short
    keeps the models it finished, and a run of a few models updates only their rows."""
    merged = {}
    if os.path.exists(results):
        with open(results) as f:
            merged = {m["model"]: m for m in json.load(f)["models"]}
    merged[record["model"]] = record
    ordered = [merged[n] for n in zoo_full.ZOO if n in merged]
    os.makedirs(os.path.dirname(results), exist_ok=True)
    with open(results, "w") as f:
        json.dump({"models": ordered}, f, indent=1)


@pytest.mark.parametrize("name", list(zoo_full.ZOO))
def test_zoo_model(name):
    record = zoo_check.measure(name)
    known = zoo_check.KNOWN_FAILURES.get(name)
    if known:
        record["note"] = known
    _save(record)
    bad = {phase: record[phase] for phase in ("inference", "training")
           if record[phase]["status"] != "pass"}
    if bad and known:
        pytest.xfail(f"[ours] {name}: {known}")
    assert not bad, {phase: (r["status"], r.get("error"), r.get("fallback_ops"))
                     for phase, r in bad.items()}


@pytest.mark.parametrize("name", list(zoo_full.ZOO))
def test_zoo_model_on_the_device(name):
    """Each model's forward and backward on the eager tpu device against the CPU: the device's
    own pass over code we did not write (it found Segformer's bilinear backward and RT-DETR's
    argument checks running on the host)."""
    record = zoo_check.measure_on_device(name)
    assert record["status"] == "pass", record

@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe"])
def test_moe_model_compiled_on_the_device(name):
    """A mixture-of-experts model moved to tpu and compiled, against CPU eager: transformers
    routes its experts through torch._grouped_mm on a tpu device for every dtype, which
    Dynamo's fake-tensor pass refused in float32 (``compile_support``)."""
    from torchtpu_compile import config
    torch._dynamo.reset()
    results = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        model, inputs = zoo_full.ZOO[name][1]()
        zoo_check.no_dropout(model)
        model = model.to(device)
        if device == "tpu":
            model.compile(backend="torchtpu")
        inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
        with config.patch(matmul_precision="highest"):
            out = zoo.first_tensor(model(*inputs)).float()
            out.square().mean().backward()
        results[device] = [out.detach().cpu()] + [p.grad.cpu() for p in model.parameters()
                                                  if p.grad is not None]
    torch.testing.assert_close(results["tpu"], results["cpu"], rtol=1e-4, atol=1e-5)


DYNAMIC_RESULTS = os.environ.get("TORCHTPU_ZOO_DYNAMIC_RESULTS",
                                 os.path.join("build", "coverage", "dynamic_zoo.json"))


@pytest.mark.parametrize("name", zoo_check.text_models())
def test_zoo_text_model_at_many_lengths(name):
    """Issue 17's dynamic-length pass: outputs match eager's at each of 6 random (batch,
    sequence) shapes, and no graph compiles per shape (at most one program per bucket)."""
    record = zoo_check.measure_dynamic(name)
    _save(record, DYNAMIC_RESULTS)
    assert record["status"] != "fail", record.get("error")
    assert record["status"] == "pass", f"{name} compiles per shape: {record['reasons']}"
