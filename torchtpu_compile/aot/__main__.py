"""``python -m torchtpu_compile.aot export|run|inspect``.

    python -m torchtpu_compile.aot export mypkg.models:make_model --out model.tpu
    python -m torchtpu_compile.aot run model.tpu
    python -m torchtpu_compile.aot inspect model.tpu

A factory (``MODULE:FACTORY``) takes no arguments and returns ``(model, example_inputs)``.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time


def _factory(spec: str):
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise SystemExit(f"expected MODULE:FACTORY, got {spec!r}")
    return getattr(importlib.import_module(module_name), attr)


def _export(args) -> int:
    import torch

    from . import compile as aot_compile
    model, example = _factory(args.factory)()
    example = example if isinstance(example, (tuple, list)) else (example,)
    start = time.perf_counter()
    artifact = aot_compile(model, tuple(example), precision=args.precision)
    artifact.save(args.out)
    print(f"wrote {args.out} in {time.perf_counter() - start:.2f}s "
          f"(precision {artifact.manifest['precision']}, torch {torch.__version__})")
    return 0


def _describe(value) -> str:
    import torch
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return type(value).__name__


def _run(args) -> int:
    from torch.utils import _pytree as pytree

    from . import load
    start = time.perf_counter()
    artifact = load(args.path)
    loaded = time.perf_counter() - start
    start = time.perf_counter()
    outputs = artifact.run_example()
    ran = time.perf_counter() - start
    how = "recompiled from portable StableHLO" if artifact.recompiled else "executable loaded"
    print(f"{args.path}: {how} in {loaded:.3f}s, first call {ran * 1e3:.1f} ms")
    for i, leaf in enumerate(pytree.tree_leaves(outputs)):
        summary = _describe(leaf)
        if hasattr(leaf, "float"):
            summary += f" sum={leaf.float().sum().item():.6g}"
        print(f"  output {i}: {summary}")
    return 0


def _inspect(args) -> int:
    from . import artifact_file
    members = artifact_file.read_members(args.path)
    manifest = json.loads(members["manifest.json"])
    if args.json:
        print(json.dumps(manifest, indent=1))
        return 0
    print(f"{args.path}: torchtpu artifact v{manifest['format_version']}, "
          f"precision {manifest['precision']}")
    print("inputs:")
    for spec in manifest["inputs"]:
        dynamic = ", ".join(sorted(spec.get("dynamic", {}), key=int))
        print(f"  {spec['name']}: {spec['dtype']}{spec['shape']}"
              + (f" (example; dynamic dims {dynamic})" if dynamic else ""))
    print("dynamic dims: " + (", ".join(
        f"{d['input']}[{d['dim']}] in {d['min']}..{d['max']}, buckets {d['buckets']}"
        for d in manifest["dynamic_dims"]) or "none (static shapes)"))
    print("versions: " + ", ".join(f"{k} {v}" for k, v in manifest["versions"].items()))
    print("executables: " + ", ".join(
        f"{p} ({v['platform_version']}"
        + (f", XLA flags {v['xla_flags']}" if v.get("xla_flags") else "")
        + (f", XLA options {v['xla_options']}" if v.get("xla_options") else "") + ")"
        for p, v in manifest["executables"].items()))
    print("sizes:")
    for name, data in sorted(members.items()):
        print(f"  {name}: {len(data):,} bytes")
    for program in manifest["programs"]:
        print(f"program {program['name']}: outputs "
              + ", ".join(f"{s['dtype']}{s['shape']}" for s in program["program_outputs"]))
        print(f"  StableHLO {manifest['stablehlo_version']}, op counts:")
        for op, count in program["stablehlo_op_counts"].items():
            print(f"    {op}: {count}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchtpu_compile.aot",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("export", help="export and compile a model from a factory")
    p.add_argument("factory", help="MODULE:FACTORY returning (model, example_inputs)")
    p.add_argument("--out", required=True, help="artifact path to write")
    p.add_argument("--precision", choices=("medium", "high", "highest"), default=None)
    p.set_defaults(fn=_export)
    p = sub.add_parser("run", help="load an artifact and run it on its example inputs")
    p.add_argument("path")
    p.set_defaults(fn=_run)
    p = sub.add_parser("inspect", help="print specs, versions, sizes and StableHLO op counts")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="print the raw manifest")
    p.set_defaults(fn=_inspect)
    args = parser.parse_args(argv)
    from .artifact_file import ArtifactError
    try:
        return args.fn(args)
    except ArtifactError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
