"""``python -m torchtpu_compile.numerics MODULE:FACTORY``: compare a model in CI.

The factory is called with no arguments and returns ``(model, example_inputs)``. The report
goes to stdout (and, with ``--json OUT``, to a file). Exit status: 0 when every output (and
gradient) is within tolerance, 1 when one is not (or torchtpu raised), 2 for a usage error
(bad arguments, a factory that cannot be imported or called).

Example::

    python -m torchtpu_compile.numerics mypkg.models:tiny_gpt2 --precision highest --train \\
        --locate --json numerics.json
"""
from __future__ import annotations

import argparse
import importlib
import sys
import traceback

EXIT_PASSED, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torchtpu_compile.numerics",
        description="Compare torch.compile(backend='torchtpu') against eager PyTorch on a "
                    "reference device. Exit status 0: within tolerance, 1: not, 2: usage error.")
    parser.add_argument("factory", metavar="MODULE:FACTORY",
                        help="a function returning (model, example_inputs), e.g. pkg.models:gpt2")
    parser.add_argument("--reference", default="auto",
                        help="auto (CUDA where present, else CPU), cuda or cpu; default auto")
    parser.add_argument("--precision", choices=("medium", "high", "highest"), default=None,
                        help="torchtpu's matmul precision; default: the mode in force")
    parser.add_argument("--train", action="store_true",
                        help="compare gradients too (training mode, dropout off)")
    parser.add_argument("--locate", action="store_true",
                        help="on failure, find the first op that diverges and its source line")
    parser.add_argument("--json", metavar="OUT", help="also write the report as JSON to OUT")
    return parser


def load_factory(spec: str):
    """``"pkg.module:name"`` -> the callable ``name`` of ``pkg.module``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r}: expected MODULE:FACTORY, e.g. mypkg.models:make_model")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} ({exc}); is its directory on "
                         f"PYTHONPATH?") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"{module_name!r} has no callable {attr!r}")
    return factory


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        factory = load_factory(args.factory)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        made = factory()
    except Exception:
        traceback.print_exc()
        print(f"error: {args.factory}() raised; see above", file=sys.stderr)
        return EXIT_USAGE
    if not (isinstance(made, (tuple, list)) and len(made) == 2):
        print(f"error: {args.factory}() must return (model, example_inputs), not "
              f"{type(made).__name__}", file=sys.stderr)
        return EXIT_USAGE
    model, example_inputs = made

    from .comparison import compare
    try:
        report = compare(model, example_inputs, reference=args.reference,
                         precision=args.precision, train=args.train, locate=args.locate)
    except ValueError as exc:  # a bad --reference, or no CUDA for --reference cuda
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(report)
    if args.json:
        report.write_json(args.json)
    return EXIT_PASSED if report.passed else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
