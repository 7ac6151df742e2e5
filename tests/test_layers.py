"""The package's layers look down only: read from every module's imports (AST, imports inside
functions included), so a lazy import cannot hide a dependency on a layer above.

Bottom up: base (config, logging, errors, counters, output slots, ...) < runtime (PJRT client,
transfers, executables, caches) < lower and kernels (FX -> StableHLO, jax_op) < core (the
program builder and run path, buckets) < front ends (the Dynamo backend and its caches, AOT,
numerics, the eager device and tpu_dist). A front end tells a lower layer what it needs through
a registration (the eager device's tensor type, tpu_dist's groups and counters), never by being
imported from below.
"""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("torchtpu_compile", "torchtpu_eager")

BASE, RUNTIME, LOWER, CORE, FRONT = range(5)
LAYER_NAMES = ("base", "runtime", "lower", "core", "front end")
#: Module (or package: everything under it) -> layer. Every module must be here.
LAYERS = {
    **{f"torchtpu_compile.{name}": BASE for name in (
        "config", "_logging", "errors", "versions", "counters", "output_slots",
        "index_errors", "fallback_policy", "host_semantics", "dtype_support", "profiling",
        "_native")},
    "torchtpu_compile.runtime": RUNTIME,
    "torchtpu_compile.lower": LOWER,
    "torchtpu_compile.kernels": LOWER,
    "torchtpu_compile.program": CORE,
    "torchtpu_compile.buckets": CORE,
    **{f"torchtpu_compile.{name}": FRONT for name in (
        "backend", "graph_cache", "dynamo_cache", "graph_breaks", "aot", "numerics",
        "report")},
    "torchtpu_compile": FRONT,  # the package itself: the public facade (stats, backend, jax_op)
    "torchtpu_eager": FRONT,
}


def _modules() -> dict:
    """{dotted module name: (path, is a package's __init__)} for every module of the packages."""
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for file in files:
                if not file.endswith(".py"):
                    continue
                path = os.path.join(folder, file)
                dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                is_package = dotted.endswith(".__init__")
                found[dotted.removesuffix(".__init__")] = (path, is_package)
    return found


MODULES = _modules()


#: Native extensions (built from csrc/ by ``make install``): modules without Python imports.
NATIVE = ("torchtpu_compile._native",)


def _known(name: str) -> str | None:
    """``name`` or the closest enclosing module of ours, or None for other packages."""
    while name and name not in MODULES and name not in NATIVE:
        name = name.rpartition(".")[0]
    return name or None


def _imported(module: str, is_package: bool, node) -> list:
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        if node.level:
            parts = module.split(".")
            parts = parts if is_package else parts[:-1]
            base = ".".join(parts[:len(parts) - node.level + 1])
            source = f"{base}.{node.module}" if node.module else base
        else:
            source = node.module
        # "from pkg import sub" imports the submodule sub, if there is one.
        targets = [f"{source}.{alias.name}" if _known(f"{source}.{alias.name}") ==
                   f"{source}.{alias.name}" else source for alias in node.names]
    return [t for t in (_known(target) for target in targets) if t]


def _import_graph() -> dict:
    graph = {name: set() for name in NATIVE}
    for module, (path, is_package) in MODULES.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        graph[module] = {(target, node.lineno) for node in ast.walk(tree)
                         if isinstance(node, (ast.Import, ast.ImportFrom))
                         for target in _imported(module, is_package, node) if target != module}
    return graph


GRAPH = _import_graph()


def layer_of(module: str) -> int:
    name = module
    while name:
        if name in LAYERS:
            return LAYERS[name]
        name = name.rpartition(".")[0]
    raise KeyError(module)


def component_of(module: str) -> str:
    """The unit inside which modules may import each other both ways: torchtpu_eager, a
    subpackage of torchtpu_compile (lower/, runtime/, aot/, ...), or a top-level module."""
    parts = module.split(".")
    return "torchtpu_eager" if parts[0] == "torchtpu_eager" else ".".join(parts[:2])


def _violations(importers: int | None, forbidden) -> list:
    found = []
    for module, imports in sorted(GRAPH.items()):
        if importers is not None and layer_of(module) != importers:
            continue
        for target, line in sorted(imports):
            if forbidden(module, target):
                found.append(f"{MODULES[module][0].removeprefix(ROOT + os.sep)}:{line} imports "
                             f"{target} ({LAYER_NAMES[layer_of(module)]} -> "
                             f"{LAYER_NAMES[layer_of(target)]})")
    return found


def test_every_module_has_a_layer():
    unplaced = []
    for module in MODULES:
        try:
            layer_of(module)
        except KeyError:
            unplaced.append(module)
    assert not unplaced, f"place these modules in a layer (LAYERS above): {unplaced}"


def test_runtime_imports_nothing_above_it():
    # Neither the lowering, the core, nor any front end: the eager device registers its
    # tensor type with runtime/device_tensors.py instead.
    assert not _violations(RUNTIME, lambda module, target: layer_of(target) > RUNTIME)


def test_lowering_imports_no_core_and_no_front_end():
    assert not _violations(LOWER, lambda module, target: layer_of(target) > LOWER)


def test_every_import_looks_down():
    assert not _violations(None, lambda module, target: layer_of(target) > layer_of(module))


def _cycles() -> list:
    """The strongly connected groups of modules (Tarjan), each sorted, of two modules or more."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []
    counter = [0]

    def visit(module):
        index[module] = low[module] = counter[0]
        counter[0] += 1
        stack.append(module)
        on_stack.add(module)
        for target, _ in GRAPH[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    return groups


def test_no_import_cycle_crosses_a_layer_or_a_component():
    # Inside one component modules may need each other (a registry and the families it
    # loads); across components (runtime and lower, backend.py and dynamo_cache.py) a cycle
    # means neither can be read, tested or loaded without the other.
    crossing = [group for group in _cycles()
                if len({component_of(m) for m in group}) > 1
                or len({layer_of(m) for m in group}) > 1]
    assert not crossing, f"import cycles across components: {crossing}"
