"""Run one zoo model compiled and eagerly, for inference and for SGD training, and measure.

``measure(name)`` returns a JSON-able record: per phase (inference, training) the verdict, the
largest error as a fraction of the reference's scale, the tolerance applied, Dynamo's graphs and
graph breaks, and the ops that fell back to eager PyTorch. The comparisons are those of
``model_checks`` (same losses, optimizer and tolerances), at matmul precision "highest".

Example::

    record = measure("gpt2")
    record["inference"]["status"], record["training"]["max_err"]
"""
from __future__ import annotations

import copy
import logging
import random
import time

import torch
import torch._dynamo
from torch._dynamo.utils import counters

import torchtpu_compile
from tests.support import zoo, zoo_full
from tests.support.model_checks import (TOLERANCES, assert_all_close, assert_close, no_dropout,
                                        train)

PRECISION = "highest"
TRAIN_STEPS = 3

#: Per-model tolerance changes, each with its reason: name -> {quantity: Tol}.
LOOSER: dict = {}

#: Per-model number of SGD steps, each with its reason: name -> (steps, reason).
STEPS: dict = {
    "mobilenet_v2": (1, "1 SGD step: training it (train-mode BatchNorm, lr 0.1, momentum 0.9) is "
                        "chaotic in float32 itself; eager CPU float32 against float64 differs by "
                        "1.2e-5 of scale in first-step gradients and 5% in the third step's loss "
                        "(float32 channels_last against contiguous: 8%), as torchtpu against "
                        "eager does (1.2e-5, 4%)"),
}

#: Models that do not match yet, each with the reason (ours to fix): name -> reason.
_ZERO_NOT_NONE = (
    "training: {heads} get zero gradients where eager leaves them None. The loss (of {output}) "
    "does not reach them ({why}), and AOTAutograd's backward returns zeros for the gradients of "
    "outputs nothing used (aot_eager and Inductor do too; pytorch#186355). Plain SGD moves "
    "nothing either way; weight decay and Adam act on a zero gradient. tests/slow/"
    "test_detection_models.py checks every gradient, reached through every output")
KNOWN_FAILURES: dict = {
    name: _ZERO_NOT_NONE.format(
        heads="the encoder's query-selection heads (enc_output, enc_score_head, enc_bbox_head)",
        output="last_hidden_state", why="the selected queries are detached")
    for name in ("rt_detr_v2", "rt_detr")} | {
    "deformable_detr": _ZERO_NOT_NONE.format(
        heads="the decoder's box-refinement heads (model.decoder.bbox_embed)", output="logits",
        why="the refined reference points are detached between layers"),
}


def _tolerances(name: str) -> dict:
    return {**TOLERANCES[PRECISION], **LOOSER.get(name, {})}


def _err(actual: torch.Tensor, expected: torch.Tensor, scale: float | None = None) -> float:
    expected = expected.detach().float()
    if scale is None:
        scale = expected.abs().max().item()
    diff = (actual.detach().float() - expected).abs().max().item() if expected.numel() else 0.0
    return diff / scale if scale > 0 else diff


def _dict_err(actual: dict, expected: dict) -> float:
    scale = max((e.detach().float().abs().max().item() for e in expected.values()), default=0.0)
    return max((_err(actual[k], expected[k], scale) for k in expected if k in actual), default=0.0)


class _Observed:
    """Dynamo graphs and graph breaks, and torchtpu fallbacks, over a block."""

    def __enter__(self):
        torch._dynamo.reset()
        counters.clear()
        torchtpu_compile.reset_stats()
        return self

    def __exit__(self, *exc):
        stats = torchtpu_compile.stats()
        self.graphs = counters["stats"]["unique_graphs"]
        self.graph_breaks = sum(counters["graph_break"].values())
        self.break_reasons = sorted({str(r).splitlines()[0] for r in counters["graph_break"]})
        self.fallbacks = dict(stats["fallback_ops"])
        self.compiled = stats["graphs_compiled"] + stats["cache_hits"]
        return False

    def record(self) -> dict:
        return {"graphs": self.graphs, "graph_breaks": self.graph_breaks,
                "break_reasons": self.break_reasons[:3], "fallback_ops": self.fallbacks}


def _verdict(phase: dict, check) -> dict:
    try:
        check()
        phase["status"] = "pass"
    except AssertionError as exc:
        phase["status"] = "fail"
        phase["error"] = " ".join(str(exc).split())[:300]
    if phase["status"] == "pass" and phase["fallback_ops"]:
        phase["status"] = "fallback"
    return phase


def _inference(model, inputs, tol) -> dict:
    model.eval()
    reference = copy.deepcopy(model)
    with _Observed() as seen:
        compiled = torch.compile(model, backend="torchtpu")
        with torch.no_grad():
            actual = zoo.first_tensor(compiled(*inputs))
    with torch.no_grad():
        expected = zoo.first_tensor(reference(*inputs))
    phase = {"max_err": _err(actual, expected), "tolerance": f"{tol['out']}", **seen.record()}
    if seen.compiled == 0:
        phase.update(status="fail", error="nothing ran through torchtpu")
        return phase
    return _verdict(phase, lambda: assert_close(actual, expected, tol["out"], "output"))


def _training(model, inputs, tol, steps: int = TRAIN_STEPS) -> dict:
    model.train()
    reference = copy.deepcopy(model)
    with _Observed() as seen:
        actual = train(model, inputs, steps, compiled=True)
    expected = train(reference, inputs, steps, compiled=False)
    errors = {"output": _err(actual.output, expected.output),
              "loss": _err(torch.stack(actual.losses), torch.stack(expected.losses)),
              "grad": _dict_err(actual.grads, expected.grads),
              "delta": _dict_err(actual.deltas, expected.deltas)}
    phase = {"max_err": max(errors.values()), "errors": errors, "steps": steps,
             "tolerance": f"grad {tol['grad']}, loss {tol['loss']}", **seen.record()}
    if seen.compiled == 0:
        phase.update(status="fail", error="nothing ran through torchtpu")
        return phase

    def check():
        assert_close(actual.output, expected.output, tol["out"], "first step output")
        assert_close(torch.stack(actual.losses), torch.stack(expected.losses), tol["loss"],
                     "losses")
        assert_all_close(actual.grads, expected.grads, tol["grad"], "grad")
        assert_all_close(actual.deltas, expected.deltas, tol["delta"], "parameter change")
        assert_all_close(actual.buffers, expected.buffers, tol["out"], "buffer")
    return _verdict(phase, check)


def _guarded(fn, *args) -> dict:
    try:
        return fn(*args)
    except Exception as exc:  # a crash in one phase is that phase's verdict, named
        return {"status": "fail", "error": f"{type(exc).__name__}: "
                                           f"{' '.join(str(exc).split())[:300]}"}


def measure(name: str) -> dict:
    """Inference and training of zoo model ``name``, compiled against eager (see module doc)."""
    family, make = zoo_full.ZOO[name]
    tol = _tolerances(name)
    start = time.perf_counter()
    try:
        with torchtpu_compile.config.patch(matmul_precision=PRECISION):
            model, inputs = make()
            no_dropout(model)
            inference = _guarded(_inference, model, inputs, tol)
            model, inputs = make()
            no_dropout(model)
            training = _guarded(_training, model, inputs, tol,
                                STEPS.get(name, (TRAIN_STEPS,))[0])
    finally:
        torch._dynamo.reset()
    return {"model": name, "family": family, "precision": PRECISION,
            "params": sum(p.numel() for p in model.parameters()),
            "inference": inference, "training": training,
            "seconds": round(time.perf_counter() - start, 1)}



# --- the eager-device pass ---------------------------------------------------------------------

#: Largest error of the tpu device against the CPU: the first output over its largest value,
#: each gradient over the largest gradient of the model (a parameter whose true gradient is
#: zero, as an attention key's bias, holds only rounding noise on either side).
DEVICE_TOLERANCE = {"output": 1e-4, "grad": 1e-3}


def _forward_backward(make, device: str) -> tuple:
    torch.manual_seed(0)
    model, inputs = make()
    no_dropout(model)
    model = model.to(device)
    inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
    out = zoo.first_tensor(model(*inputs)).float()
    # A weighted sum: a plain one hides mixed-up features and gives softmax outputs no gradient.
    (out * torch.linspace(-1, 1, out.numel(), device=device).reshape(out.shape)).sum().backward()
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach().cpu(), grads


def measure_on_device(name: str) -> dict:
    """Zoo model ``name`` forward and backward on the eager tpu device against the same on the
    CPU (strict mode off: an op that falls back is named, not failed)."""
    make = zoo_full.ZOO[name][1]
    start = time.perf_counter()
    torchtpu_compile.reset_stats()
    record = {"model": name}
    try:
        with torchtpu_compile.config.patch(matmul_precision=PRECISION):
            expected_out, expected_grads = _forward_backward(make, "cpu")
            actual_out, actual_grads = _forward_backward(make, "tpu")
    except Exception as exc:
        error = " ".join(str(exc).split())[:300]
        record.update(status="fail", error=f"{type(exc).__name__}: {error}")
        return record
    missing = sorted(set(expected_grads) ^ set(actual_grads))
    record.update(output_err=_err(actual_out, expected_out),
                  grad_err=_dict_err(actual_grads, expected_grads), missing_grads=missing[:5],
                  fallbacks=torchtpu_compile.stats()["eager_fallbacks"],
                  seconds=round(time.perf_counter() - start, 1))
    good = record["output_err"] <= DEVICE_TOLERANCE["output"] and \
        record["grad_err"] <= DEVICE_TOLERANCE["grad"] and not missing
    record["status"] = "pass" if good else "fail"
    return record

# --- the dynamic-length pass -------------------------------------------------------------------

#: Calls per text model in the dynamic pass, each at a random batch size and sequence length.
DYNAMIC_CALLS = 6
#: Where the pass draws sizes: batch 1..4, sequence 2..48 (the tiny configs hold 64 positions).
DYNAMIC_BATCH, DYNAMIC_SEQ = (1, 4), (2, 48)


def _dynamic_shapes(inputs, seed: int) -> list:
    """DYNAMIC_CALLS input tuples like ``inputs`` (token ids, or None), each at its own random
    batch size and, per ids tensor, sequence length; ids drawn from the example's range."""
    rng = random.Random(seed)
    calls = []
    for _ in range(DYNAMIC_CALLS):
        batch = rng.randint(*DYNAMIC_BATCH)
        call = []
        for x in inputs:
            if x is None:
                call.append(None)
                continue
            low, high = int(x.min()), int(x.max())
            call.append(torch.randint(low, high + 1, (batch, rng.randint(*DYNAMIC_SEQ))))
        calls.append(tuple(call))
    return calls


class _ExactShapeReasons(logging.Handler):
    """The reasons torchtpu logs for graphs it compiles once per shape (program/runner.py)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.reasons: list = []

    def emit(self, record):
        message = record.getMessage()
        if "compiles once per shape" in message:
            self.reasons.append(message.split("not per bucket: ", 1)[-1])


def measure_dynamic(name: str, seed: int = 0) -> dict:
    """Text model ``name`` compiled once (Dynamo's automatic dynamic shapes), then called at
    DYNAMIC_CALLS random batch sizes and sequence lengths, each output against eager's.

    ``status``: "pass" (every output matches and every graph compiled per bucket, not per
    shape), "per-shape" (outputs match, but a graph compiled per shape: ``reasons`` names the
    op) or "fail". ``compiles`` and ``buckets``: programs built and buckets touched, per graph.

    Example::

        record = measure_dynamic("gpt2")
        record["status"], record["compiles"], record["buckets"]
    """
    family, make = zoo_full.ZOO[name]
    tol = _tolerances(name)
    handler = _ExactShapeReasons()
    logging.getLogger("torchtpu").addHandler(handler)
    start = time.perf_counter()
    record = {"model": name, "family": family, "calls": DYNAMIC_CALLS}
    try:
        with torchtpu_compile.config.patch(matmul_precision=PRECISION), torch.no_grad():
            model, inputs = make()
            no_dropout(model)
            model.eval()
            reference = copy.deepcopy(model)
            calls = _dynamic_shapes(inputs, seed)
            record["shapes"] = [[list(x.shape) for x in c if x is not None] for c in calls]
            errors = []
            with _Observed() as seen:
                compiled = torch.compile(model, backend="torchtpu")
                for call in calls:
                    actual = zoo.first_tensor(compiled(*call))
                    expected = zoo.first_tensor(reference(*call))
                    errors.append(_err(actual, expected))
                    assert_close(actual, expected, tol["out"], f"output at {record['shapes']}")
            stats = torchtpu_compile.stats()
            graphs = stats["graphs"].values()
            record.update(seen.record(), max_err=max(errors),
                          compiles=[g["compiles"] for g in graphs],
                          buckets=[len(g["buckets"]) for g in graphs],
                          exact_shape_compiles=stats["buckets"]["exact_shape_compiles"],
                          reasons=sorted(set(handler.reasons)))
            per_shape = record["exact_shape_compiles"] > 0 or \
                any(c > b and b for c, b in zip(record["compiles"], record["buckets"]))
            if record["graphs"] >= len({str(s) for s in record["shapes"]}):
                per_shape = True
                record["reasons"].append("Dynamo traced a graph per shape (a guard specializes "
                                         "the sizes)")
            record["status"] = "per-shape" if per_shape else "pass"
    except Exception as exc:  # an assertion or a crash: this model's verdict, named
        record.update(status="fail", error=f"{type(exc).__name__}: "
                                           f"{' '.join(str(exc).split())[:300]}")
    finally:
        logging.getLogger("torchtpu").removeHandler(handler)
        torch._dynamo.reset()
    record["seconds"] = round(time.perf_counter() - start, 1)
    return record


def text_models() -> list:
    """The zoo's text models: the ones the dynamic-length pass calls at many lengths."""
    return [name for name, (family, _) in zoo_full.ZOO.items() if family == "text"]
