"""``compare``: torchtpu against eager PyTorch on a reference device, output by output."""
from __future__ import annotations

import torch

from .. import counters
from .._logging import log
from ..lower.precision import MODES, resolve_precision
from .policy import compare_tensors, tolerance
from .report import Report
from .sides import Side, full_fp32, reference_device, torchtpu_precision


def compare(model_or_fn, example_inputs, reference: str = "auto", precision: str | None = None,
            train: bool = False, locate: bool = False) -> Report:
    """Run ``model_or_fn`` eagerly on the reference device and through
    ``torch.compile(backend="torchtpu")``, and compare every output (and, with ``train=True``,
    every gradient) under the tolerance of the precision mode and dtype.

    - ``reference``: ``"auto"`` (CUDA where present, else CPU), ``"cuda"`` or ``"cpu"``; the
      reference always computes in full float32 (no TF32, no bf16 matmuls).
    - ``precision``: torchtpu's matmul precision for this run (``"medium"``, ``"high"``,
      ``"highest"``); None uses the mode in force (``torchtpu_compile.config.matmul_precision``,
      else ``torch.set_float32_matmul_precision``, else ``"medium"``).
    - ``train``: training mode, dropout off; gradients of fixed random cotangents of the outputs
      with respect to the parameters (and to inputs that require grad) are compared too.
    - ``locate``: on failure, run the captured ATen graphs node by node and report the first
      op that diverges, with its source line (``report.divergence``).

    A module is deep-copied for each side, so the caller's model and inputs are not touched;
    a plain function is called as it is (a module it closes over is shared by both sides).

    Example::

        report = compare(model, (torch.randn(8, 16),), precision="highest", locate=True)
        assert report.passed, report
    """
    from ..runtime.client import get_client

    device = reference_device(reference)
    mode = precision if precision is not None else resolve_precision()
    if mode not in MODES:
        raise ValueError(f"precision={precision!r}: expected one of {', '.join(MODES)} or None")
    inputs = _as_tuple(example_inputs)

    with full_fp32(device):
        expected, cotangents = Side.build(model_or_fn, inputs, device, train).run()

    torch._dynamo.reset()  # transformers share code objects: stale frames hit the recompile limit
    before = counters.stats()
    side = Side.build(model_or_fn, inputs, None, train)
    compiled = torch.compile(side.fn, backend="torchtpu")
    try:
        with torchtpu_precision(mode):
            actual, _ = side.run(compiled, cotangents)
    finally:
        torch._dynamo.reset()
    after = counters.stats()

    report = Report(reference=str(device), precision=mode, platform=get_client().platform,
                    train=train, fallback_ops=_new_fallbacks(before, after))
    if after["graphs_compiled"] + after["cache_hits"] == before["graphs_compiled"] + \
            before["cache_hits"]:
        report.problems.append("no graph ran through torchtpu: Dynamo ran the model eagerly "
                               "(graph breaks everywhere?), so nothing was compared")
    for group, shared_scale in (("outputs", False), ("grads", True), ("buffers", False)):
        ours, theirs = getattr(actual, group), getattr(expected, group)
        report.checks += _check_group(ours, theirs, mode, shared_scale)
        report.problems += [f"{name} exists only on the torchtpu side"
                            for name in ours.keys() - theirs.keys()]
    log.info("%s", report)

    if locate and not report.passed:
        from .locate import locate_divergence
        report.divergence, report.locate_note = locate_divergence(
            model_or_fn, inputs, device, mode, train, cotangents, expected)
    return report


def _as_tuple(example_inputs) -> tuple:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs)
    raise TypeError(f"example_inputs must be a tensor or a tuple of positional arguments, not "
                    f"{type(example_inputs).__name__}")


def _check_group(actual: dict, expected: dict, mode: str, shared_scale: bool) -> list:
    """Compare tensors by name. With ``shared_scale``, all use the largest reference magnitude
    of the group: gradients of one loss are commensurate, and a gradient that is zero in exact
    arithmetic (a bias before a norm) is rounding noise on both sides."""
    scale = None
    if shared_scale and expected:
        scale = max((t.detach().abs().max().item() for t in expected.values()
                     if t.is_floating_point() and t.numel()), default=0.0)
    checks = []
    for name, ref in expected.items():
        checks.append(compare_tensors(name, actual.get(name), ref, tolerance(mode, ref.dtype),
                                      scale if ref.is_floating_point() else None))
    return checks


def _new_fallbacks(before: dict, after: dict) -> dict:
    old = before["fallback_ops"]
    return {op: n - old.get(op, 0) for op, n in after["fallback_ops"].items()
            if n > old.get(op, 0)}


def assert_numerics(model_or_fn, example_inputs, **options) -> Report:
    """``compare`` with ``locate=True`` by default; AssertionError with the report on failure.

    Example::

        assert_numerics(model, (x,), precision="highest", train=True)
    """
    options.setdefault("locate", True)
    report = compare(model_or_fn, example_inputs, **options)
    if not report.passed:
        raise AssertionError(f"torchtpu differs from eager PyTorch beyond tolerance:\n{report}")
    return report
