"""What ``compare`` returns: every checked tensor, the verdict, and where a failure started.

Example::

    report = compare(model, (x,))
    print(report)                      # one line per tensor, then the verdict
    report.failures                    # the TensorChecks that failed
    report.divergence                  # with locate=True: the first op beyond tolerance
    report.write_json("numerics.json")
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

from .policy import TensorCheck


@dataclass
class Divergence:
    """The first node of the captured ATen graphs whose torchtpu output is beyond tolerance,
    given exactly the reference's inputs."""
    graph: str           # "forward graph 0", "backward graph 0", "inference graph 0"
    node: str            # the FX node's name
    op: str              # "aten.tanh.default"
    inputs: list         # ["float32[8, 64]", "2"]
    outputs: list        # ["float32[8, 64]"]
    check: TensorCheck   # errors of its first failing output
    source_line: str     # "model.py:12: y = torch.tanh(h)", or "unknown source line"
    module: str = ""     # the innermost submodule that ran it: "blocks.0.mlp (MLP)"
    # > 0: no error but a choice: this many indices name other positions of equal values
    # than eager's (topk, sort, median, ...), whose order eager PyTorch leaves unspecified.
    ties: int = 0

    def __str__(self) -> str:
        c = self.check
        module = f" in module {self.module}" if self.module else ""
        head = (f"{self.op}({', '.join(self.inputs)}) -> {', '.join(self.outputs)} in "
                f"{self.graph} (node {self.node})\n  at {self.source_line}{module}\n")
        if self.ties:
            return (f"first divergence, from ties: {head}"
                    f"  the same values as eager, but {self.ties} indices name other elements "
                    f"of equal value. Eager PyTorch leaves that choice unspecified (its CPU and "
                    f"CUDA kernels differ too; torchtpu's topk takes the lowest index first): "
                    f"the outputs depend on how ties are broken. Compare on inputs without "
                    f"them")
        return (f"first divergence: {head}"
                f"  max_abs {c.max_abs:.3g} (limit {c.atol + c.rtol * c.scale:.3g}), "
                f"max_abs/scale {c.rel_max_abs:.3g}, max_rel {c.max_rel:.3g}")


@dataclass
class Report:
    """The outcome of one comparison; ``passed`` is True when every check is within tolerance."""
    reference: str                  # the reference device: "cpu", "cuda"
    precision: str                  # torchtpu's matmul precision mode
    platform: str                   # torchtpu's PJRT platform
    train: bool
    checks: list = field(default_factory=list)          # TensorChecks, outputs then gradients
    fallback_ops: dict = field(default_factory=dict)    # ops torchtpu ran in eager PyTorch
    problems: list = field(default_factory=list)        # failures that are not a tensor's
    divergence: Divergence | None = None
    locate_note: str | None = None  # what locate found or why it found nothing; None: not run

    @property
    def failures(self) -> list:
        return [c for c in self.checks if not c.passed]

    @property
    def passed(self) -> bool:
        return not self.problems and not self.failures

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        mode = "training (outputs and gradients)" if self.train else "inference"
        lines = [f"torchtpu numerics: {mode}, precision {self.precision!r} on {self.platform}, "
                 f"against eager PyTorch on {self.reference}"]
        lines += ["  " + c.summary() for c in self.checks]
        lines += [f"  FAIL {p}" for p in self.problems]
        if self.fallback_ops:
            lines.append(f"  ran in eager PyTorch (fallback): {self.fallback_ops}")
        verdict = "PASSED" if self.passed else f"FAILED ({len(self.failures)} of " \
                                               f"{len(self.checks)} tensors beyond tolerance)"
        lines.append(verdict)
        if self.divergence is not None:
            lines.append(str(self.divergence))
        elif self.locate_note:
            lines.append(f"locate: {self.locate_note}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """Plain data for JSON; infinities become strings."""
        data = dataclasses.asdict(self)
        data["passed"] = self.passed
        return _json_safe(data)

    def write_json(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
