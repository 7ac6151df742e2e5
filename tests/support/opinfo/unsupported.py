"""OpInfo samples at dtypes an op does not support: where eager CPU raises, we raise.

OpInfo says which dtypes each op's CPU kernel takes (``op.supported_dtypes("cpu")``, what
PyTorch's ``test_dtypes`` checks). For each of ``DTYPES`` it does not list, the op's samples are
built at that dtype (a sample function that cannot build them: ``unbuildable``, counted, not
run) and judged as error inputs are (``errors.py``): eager CPU first, which must raise (where it
returns a value the dtype is supported after all: ``cpu-specific``), its exception type the
reference; then the path: ``pass``, ``returns-value``, ``other-error`` or ``dynamo``.

Path ``inductor`` (``torch.compile(backend="inductor")``, judged the same way) is PyTorch's own
compiler: no reference (eager is), but it says where it does as we do. It takes seconds per
input, so it runs only when asked (``--paths inductor``, best on the entries ours failed).

Example::

    python -m tests.support.opinfo.sweep --unsupported-dtypes --ops bmm,matmul
"""
from __future__ import annotations

import time

import torch

from . import errors, skips
from .harness import DTYPE_NAMES, _sample_call, entry_name, skipped

#: The dtypes tried: every one that OpInfo's CPU claims leave out is run.
DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64)


def unsupported_dtypes(op) -> list:
    """The names (``harness.DTYPE_NAMES``) of ``DTYPES`` that ``op``'s CPU claims leave out.

    Example::

        unsupported_dtypes(bmm)   # ["b8"]
    """
    supported = op.supported_dtypes("cpu")
    return [DTYPE_NAMES[d] for d in DTYPES if d not in supported]


def check_unsupported(op, path: str, dtype: torch.dtype, max_samples: int = 1
                      ) -> errors.ErrorResult:
    """Run the first ``max_samples`` samples of OpInfo ``op`` at ``dtype`` (one it does not
    claim on CPU) on ``path``, judged as error inputs (module doc); 0 runs them all.

    Example::

        check_unsupported(bmm, "compile", torch.bool).verdicts   # {"pass": 1}
    """
    result = errors.ErrorResult(entry_name(op), path, DTYPE_NAMES[dtype], "pass")
    if skipped(result, table=skips.ERROR_SKIPS):
        return result
    start = time.perf_counter()
    notes: list = []
    try:
        samples = list(op.sample_inputs("cpu", dtype))
    except Exception as exc:  # noqa: BLE001  (the sample function's own limits)
        errors._record(result, notes, "samples", "unbuildable")
        notes.append(f"sample inputs do not build at {dtype}: {errors.Raised(exc)}")
        samples = []
    for index, sample in enumerate(samples[:max_samples or None]):
        def call(run, sample=sample):
            args, kwargs = _sample_call(sample)
            return errors._call(run, op.op, args, kwargs)
        errors._check_input(result, notes, f"{index}: {errors._describe(sample)}", call, None)
    return errors._conclude(result, start, notes)
