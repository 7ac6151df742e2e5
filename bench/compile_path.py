"""Compile-path benchmarks: torchtpu against eager PyTorch and Inductor, measured in one run.

Every steady-state number comes from one process in which the three contenders run
interleaved (see ``common.interleaved``), so the ratios hold even when the machine's speed
drifts. The process runs with ``torch.set_float32_matmul_precision("highest")`` so that all
three do fp32 math (torchtpu's default, "medium", would emulate bf16 operands on CPU).

Cold compile times are the exception: each is measured in a fresh subprocess with empty
on-disk caches (``TORCHINDUCTOR_CACHE_DIR``, ``TORCHTPU_CACHE_DIR``), since in-process and disk
caches would otherwise answer.

Warm-cache first calls run the same child a second time over the cold run's cache dirs (a new
process that finds every torchtpu cache level filled); AOT artifacts are exported in one fresh
process and loaded in another, with empty compile caches.

Run one cold measurement by hand with ``python bench/compile_path.py --cold torchtpu``.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import OtherLoad, interleaved, median, result  # noqa: E402

PRECISION = "highest"

# Targets for torchtpu/inductor (lower is better), reported next to each ratio.
TARGET_STEADY = 1.0
TARGET_OVERHEAD = 1.5
TARGET_COLD = 0.5
# Target for torchtpu's warm-cache first call / its cold first call.
TARGET_WARM = 0.3


def mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    """A 4-layer ReLU MLP, batch 64, width 1024."""
    torch.manual_seed(0)
    layers = []
    for i in range(4):
        layers.append(torch.nn.Linear(1024, 1024))
        if i < 3:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).eval(), torch.randn(64, 1024)


def gpt2(dropout: float = 0.0) -> tuple[torch.nn.Module, torch.Tensor]:
    """A small random-init GPT-2 (4 layers, width 256), batch 4 x 128 tokens, in eval mode;
    ``dropout``: on embeddings, attention and residuals (0: none).

    Bigger than tests/support/zoo.py's, so that compute is not lost in per-call overhead, and small
    enough that Inductor compiles it in well under a minute on two cores.
    """
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=1000, n_embd=256, n_layer=4, n_head=4, n_positions=128,
                     resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                     use_cache=False, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    model = GPT2LMHeadModel(cfg).eval()
    # Named explicitly: with no loss type, transformers logs a warning from inside forward,
    # which is a Dynamo graph break (two graphs instead of one for the training step).
    model.loss_type = "ForCausalLM"
    return model, torch.randint(0, cfg.vocab_size, (4, 128))


def _compiled(module: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Eager, Inductor and torchtpu versions, each over its own copy of the weights."""
    import torchtpu_compile
    torchtpu_compile.reset_stats()  # so that _fallback_note speaks of this benchmark alone
    return {
        "eager": module,
        "inductor": torch.compile(copy.deepcopy(module), backend="inductor"),
        "torchtpu": torch.compile(copy.deepcopy(module), backend="torchtpu"),
    }


def _fallback_note() -> list[str]:
    import torchtpu_compile
    fallback = torchtpu_compile.stats()["fallback_ops"]
    return [f"torchtpu ran ops in eager fallback: {fallback}"] if fallback else []


def bench_mlp(quick: bool) -> list[dict]:
    """Steady-state inference latency of the MLP under no_grad: the call alone, and the call
    with its output read (``m(x).sum()``: torch's own threads then run next to XLA's)."""
    model, x = mlp()
    compiled = _compiled(model)
    rows = []
    for name, read in (("mlp forward (steady)", False), ("mlp forward, output read", True)):
        with torch.no_grad():
            fns = {k: ((lambda m=m: m(x).sum()) if read else (lambda m=m: m(x)))
                   for k, m in compiled.items()}
            times, busy = interleaved(fns, rounds=8 if quick else 30, inner=3 if quick else 5)
        notes = _fallback_note()
        if read:
            # Measured: torch's OpenMP workers spin after each torch op (libgomp's default
            # wait policy) on the cores XLA's threads then need; passive waiting removes it.
            notes.append(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
        rows.append(result(name, times, TARGET_STEADY, notes, others_cpu=busy))
    return rows


def bench_gpt2_forward(quick: bool) -> list[dict]:
    """Steady-state inference latency of the small GPT-2 under no_grad."""
    model, ids = gpt2()
    with torch.no_grad():
        fns = {k: (lambda m=m: m(ids)) for k, m in _compiled(model).items()}
        times, busy = interleaved(fns, rounds=3 if quick else 20, warmup=1 if quick else 2)
    return [result("gpt2 forward (steady)", times, TARGET_STEADY, _fallback_note(),
                   others_cpu=busy)]


def bench_gpt2_train(quick: bool) -> list[dict]:
    """Steady-state training step: compiled model forward + loss + backward, eager SGD step.

    Only the model is compiled; the optimizer step is the same eager code for all three, as
    it would be in a typical training loop that compiles the model alone.
    """
    model, ids = gpt2()
    model.train()  # dropout probabilities are 0, so train mode is deterministic

    def step_fn(m):
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)

        def step():
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    fns = {k: step_fn(m) for k, m in _compiled(model).items()}
    times, busy = interleaved(fns, rounds=2 if quick else 12, warmup=1 if quick else 2)
    return [result("gpt2 train step SGD (steady)", times, TARGET_STEADY, _fallback_note(),
                   others_cpu=busy)]


def bench_dropout_train(quick: bool) -> list[dict]:
    """The GPT-2 training step with dropout 0.1 everywhere (embeddings, attention, residuals):
    torchtpu drawing the masks inside the program (``config.random_draws="device"``, the
    default on TPU) and on the host ("host", the default on the CPU client: a host draw and an
    upload of every mask at each step)."""
    from torchtpu_compile import config
    model, ids = gpt2(dropout=0.1)
    model.train()

    def step_fn(m, host_draws=False):
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)

        def step():
            # read when a graph is built
            with config.patch(random_draws="host" if host_draws else "device"):
                loss = m(input_ids=ids, labels=ids).loss
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    compiled = _compiled(model)
    fns = {k: step_fn(m) for k, m in compiled.items()}
    fns["host draws"] = step_fn(torch.compile(copy.deepcopy(model), backend="torchtpu"), True)
    times, busy = interleaved(fns, rounds=2 if quick else 10, warmup=1 if quick else 2)
    host = dict(times, torchtpu=times.pop("host draws"))
    device_vs_host = times["torchtpu"] / host["torchtpu"]
    return [result("gpt2 train step, dropout 0.1, device draws", times, TARGET_STEADY,
                   _fallback_note() + [f"{device_vs_host:.2f}x the host-draw step's time"],
                   others_cpu=busy),
            result("gpt2 train step, dropout 0.1, host draws", host, None, [],
                   others_cpu=busy)]


def _fresh_function(fn):
    """A copy of ``fn`` with its own code object.

    Dynamo caches compiled frames per code object; giving each backend its own keeps one
    backend's cache entries (and their guard checks) off the other's call path.
    """
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)


def bench_overhead(quick: bool) -> list[dict]:
    """Per-call overhead: a one-op graph (x + 1) on 8 elements, where compute is negligible."""
    def add_one(x):
        return x + 1

    x = torch.randn(8)
    inductor = torch.compile(_fresh_function(add_one), backend="inductor")
    torchtpu = torch.compile(_fresh_function(add_one), backend="torchtpu")
    fns = {"eager": lambda: add_one(x), "inductor": lambda: inductor(x),
           "torchtpu": lambda: torchtpu(x)}
    times, busy = interleaved(fns, rounds=10 if quick else 30, inner=100 if quick else 300,
                              warmup=3)
    return [result("one-op call overhead", times, TARGET_OVERHEAD, others_cpu=busy)]


def _dynamo_phase_seconds() -> dict[str, float]:
    """Dynamo's cumulative compile-phase timers (tracing, backend compiler, aot_autograd)."""
    names, values = torch._dynamo.utils.compile_times(repr="csv")
    # A phase that ran several times (one per frame or graph) lists each time, comma-separated.
    return {name: sum(float(v) for v in value.split(",")) for name, value in zip(names, values)}


def _cold_child(backend: str) -> dict:
    """In a fresh process: the first call of the compiled GPT-2 forward.

    A one-op graph is compiled first, then ``torch._dynamo.reset()``: lazy imports, the PJRT
    client, Inductor's toolchain probes and torch's own lazy initialization are paid before the
    clock starts, so the number is the compile work for this model (Dynamo trace,
    aot_autograd, then lowering + XLA compile or Inductor codegen + C++ builds).
    """
    torch.set_float32_matmul_precision(PRECISION)
    start = time.perf_counter()
    tiny = torch.compile(_fresh_function(lambda x: x * 2), backend=backend)
    tiny(torch.randn(8))
    warmup_seconds = time.perf_counter() - start
    torch._dynamo.reset()
    if backend == "torchtpu":
        import torchtpu_compile
        torchtpu_compile.reset_stats()

    model, ids = gpt2()
    with torch.no_grad():
        model(ids)
        compiled = torch.compile(model, backend=backend)
        before = _dynamo_phase_seconds()
        start = time.perf_counter()
        compiled(ids)
        first = time.perf_counter() - start
    after = _dynamo_phase_seconds()
    phases = {k: v - before.get(k, 0.0) for k, v in after.items()}
    out = {"first_call_s": first, "warmup_s": warmup_seconds, "phases": phases}
    if backend == "torchtpu":
        out["stats"] = torchtpu_compile.stats()
    return out


def _run_child(args: list[str], cache_dir: str, dynamo_cache: bool | None = None) -> dict:
    """Run this file with ``args`` in a new interpreter whose compile caches are in
    ``cache_dir``, with torchtpu's default settings (``dynamo_cache``: TORCHTPU_DYNAMO_CACHE set
    to it); the JSON it prints."""
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    env["TORCHTPU_CACHE_DIR"] = cache_dir  # torchtpu's disk cache, where it has one
    for name in ("TORCHTPU_REMOTE_CACHE", "TORCHTPU_GRAPH_CACHE", "TORCHTPU_DYNAMO_CACHE"):
        env.pop(name, None)
    if dynamo_cache is not None:
        env["TORCHTPU_DYNAMO_CACHE"] = "1" if dynamo_cache else "0"
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *args],
                          env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _run_cold(backend: str) -> dict:
    """Run ``_cold_child`` in a new interpreter with empty on-disk compile caches."""
    return _run_cold_then_warm(backend, warm=False)[0]


def _run_cold_then_warm(backend: str, warm: bool = True) -> list[dict]:
    """``_cold_child`` with empty caches, default settings; then (``warm``) again over the
    caches it filled: once with the default settings, once with the Dynamo-level cache off
    (what the default was before it was on)."""
    cache_dir = tempfile.mkdtemp(prefix="bench_cold_cache_")
    try:
        runs = [_run_child(["--cold", backend], cache_dir)]
        if warm:
            runs.append(_run_child(["--cold", backend], cache_dir))
            runs.append(_run_child(["--cold", backend], cache_dir, dynamo_cache=False))
        return runs
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def bench_cold_compile(quick: bool) -> list[dict]:
    """First-call time of the GPT-2 forward in fresh processes, torchtpu vs Inductor."""
    runs: dict[str, list[dict]] = {"torchtpu": [], "inductor": []}
    with OtherLoad() as load:
        for _ in range(1 if quick else 3):
            for backend in runs:  # alternate, so both see the same machine drift
                runs[backend].append(_run_cold(backend))
    first = {b: median([r["first_call_s"] for r in rs]) for b, rs in runs.items()}

    def phase(backend, name):
        return median([r["phases"].get(name, 0.0) for r in runs[backend]])

    def split(backend):
        backend_s = phase(backend, "OutputGraph.call_user_compiler")
        return phase(backend, "_compile.compile_inner") - backend_s, backend_s

    tpu_runs = runs["torchtpu"]
    lowering = median([r["stats"]["lowering_seconds"] for r in tpu_runs])
    xla = median([r["stats"]["xla_compile_seconds"] for r in tpu_runs])
    tpu_trace, tpu_backend = split("torchtpu")
    aot = phase("torchtpu", "create_aot_dispatcher_function")
    ind_trace, ind_backend = split("inductor")
    notes = [
        f"fresh process and empty cache dirs per run, {len(tpu_runs)} run(s) each, median; "
        f"not counted: a one-op warm-up compile first (imports, client; torchtpu "
        f"{median([r['warmup_s'] for r in tpu_runs]):.1f} s, inductor "
        f"{median([r['warmup_s'] for r in runs['inductor']]):.1f} s)",
        f"torchtpu: dynamo trace {tpu_trace:.2f} s + backend {tpu_backend:.2f} s (aot_autograd "
        f"incl. our compiler {aot:.2f} s, of which lowering {lowering:.2f} s + xla compile "
        f"{xla:.2f} s); graphs compiled {tpu_runs[0]['stats']['graphs_compiled']}",
        f"inductor: dynamo trace {ind_trace:.2f} s + backend {ind_backend:.2f} s (of which "
        f"waiting on C++ builds {phase('inductor', 'async_compile.wait'):.2f} s)",
    ]
    return [result("gpt2 forward cold compile", first, TARGET_COLD, notes, load.share)]


def _status(ratio: float, target: float) -> str:
    return "PASS" if ratio <= target else "MISS"


def bench_warm_compile(quick: bool) -> list[dict]:
    """torchtpu's first call of the GPT-2 forward in a fresh process over warm caches, default
    settings, against the cold first call that filled them (fresh processes, median)."""
    triples = []
    with OtherLoad() as load:
        for _ in range(1 if quick else 3):
            triples.append(_run_cold_then_warm("torchtpu"))
    cold = median([c["first_call_s"] for c, _, _ in triples])
    warm = median([w["first_call_s"] for _, w, _ in triples])
    untraced_runs = [u for _, _, u in triples]
    without = median([u["first_call_s"] for u in untraced_runs])

    def phase(run, name):
        return run["phases"].get(name, 0.0)

    warm_runs = [w for _, w, _ in triples]
    backend = median([phase(u, "OutputGraph.call_user_compiler") for u in untraced_runs])
    dynamo = median([phase(u, "_compile.compile_inner") for u in untraced_runs]) - backend
    # What a cache of Dynamo's own output could at best leave: the warm call without Dynamo's
    # bytecode tracing (guards are still built, the backend still loads from our caches).
    floor = median([u["first_call_s"] - phase(u, "bytecode_tracing") for u in untraced_runs])
    hits = {name: (untraced_runs[0]["stats"]["caches"][name]["all"]["hits"],
                   untraced_runs[0]["stats"]["caches"][name]["all"]["misses"])
            for name in ("aot_autograd", "lowering")}
    frames = {name: median([w["stats"]["caches"]["dynamo"]["all"][name] for w in warm_runs])
              for name in ("frames_loaded", "entries_rejected", "bypasses")}
    ratio = warm / cold
    row = result("gpt2 forward warm-cache first call", {"torchtpu": warm}, notes=[
        f"torchtpu warm, default settings (Dynamo-level cache on) {warm:.2f} s / cold "
        f"{cold:.2f} s = {ratio:.2f}x (target <= {TARGET_WARM}: {_status(ratio, TARGET_WARM)}); "
        f"Dynamo frames loaded {frames['frames_loaded']:.0f}, entries refused "
        f"{frames['entries_rejected']:.0f}, frames not cacheable {frames['bypasses']:.0f}; "
        f"{len(triples)} triple(s) of fresh processes (cold, then warm with the default and "
        f"with TORCHTPU_DYNAMO_CACHE=0, over the cold one's cache dir), median",
        f"torchtpu warm with the Dynamo-level cache off (TORCHTPU_DYNAMO_CACHE=0) "
        f"{without:.2f} s / cold {cold:.2f} s = {without / cold:.2f}x",
        f"warm, cache off: dynamo trace {dynamo:.2f} s + backend {backend:.2f} s (graph cache "
        f"load, runner rebuild, executable load); graph cache hits/misses: aot_autograd "
        f"{hits['aot_autograd'][0]}/{hits['aot_autograd'][1]}, lowering "
        f"{hits['lowering'][0]}/{hits['lowering'][1]}; XLA compiles "
        f"{untraced_runs[0]['stats']['graphs_compiled']}",
        f"warm with the cache off, less Dynamo's bytecode tracing (the floor of a Dynamo-level "
        f"cache): {floor:.2f} s = {floor / cold:.2f}x cold",
    ], others_cpu=load.share)
    row["target"], row["status"] = TARGET_WARM, _status(ratio, TARGET_WARM)
    row["torchtpu_warm_vs_cold"] = ratio
    row["torchtpu_warm_without_dynamo_cache_vs_cold"] = without / cold
    return [row]


def _aot_export_child(path: str) -> dict:
    """In a fresh process: export and compile the GPT-2 forward to an artifact at ``path``."""
    import torchtpu_compile.aot as aot
    torch.set_float32_matmul_precision(PRECISION)
    model, ids = gpt2()
    start = time.perf_counter()
    aot.compile(model, (ids,)).save(path)
    return {"export_compile_s": time.perf_counter() - start}


def _aot_load_child(path: str) -> dict:
    """In a fresh process: load the artifact and make the first call.

    Imports and the PJRT client are paid before the clock starts, as in ``_cold_child``.
    """
    import torchtpu_compile.aot as aot
    from torchtpu_compile.runtime.client import get_client
    torch.set_float32_matmul_precision(PRECISION)
    get_client()
    _, ids = gpt2()
    start = time.perf_counter()
    run = aot.load(path)
    loaded = time.perf_counter() - start
    run(ids)
    return {"load_s": loaded, "first_call_s": time.perf_counter() - start,
            "recompiled": run.recompiled}


def bench_aot_artifact(quick: bool) -> list[dict]:
    """Loading an AOT artifact of the GPT-2 forward and calling it, in a fresh process, against
    compiling from scratch (torch.compile's cold first call)."""
    work = tempfile.mkdtemp(prefix="bench_aot_")
    path = os.path.join(work, "gpt2.tpu")
    try:
        exported = _run_child(["--aot-export", path], os.path.join(work, "export-cache"))
        loads, colds = [], []
        with OtherLoad() as load:
            for i in range(1 if quick else 3):  # alternate, so both see the same drift
                loads.append(_run_child(["--aot-load", path], os.path.join(work, f"load-{i}")))
                colds.append(_run_cold("torchtpu"))
        size = os.path.getsize(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    first = median([r["first_call_s"] for r in loads])
    cold = median([r["first_call_s"] for r in colds])
    row = result("gpt2 forward AOT artifact load + first call", {"torchtpu": first}, notes=[
        f"artifact load + first call {first:.2f} s (load {median([r['load_s'] for r in loads]):.2f}"
        f" s) / torch.compile cold first call {cold:.2f} s = {first / cold:.2f}x; "
        f"{len(loads)} run(s) each in fresh processes, median",
        f"export + compile + save, once: {exported['export_compile_s']:.2f} s; artifact "
        f"{size / 1e6:.1f} MB; recompiled on load: {any(r['recompiled'] for r in loads)}",
    ], others_cpu=load.share)
    row["torchtpu_aot_vs_cold"] = first / cold
    return [row]


BENCHMARKS = {
    "mlp": bench_mlp,
    "gpt2_forward": bench_gpt2_forward,
    "gpt2_train": bench_gpt2_train,
    "dropout_train": bench_dropout_train,
    "overhead": bench_overhead,
    "cold_compile": bench_cold_compile,
    "warm_compile": bench_warm_compile,
    "aot_artifact": bench_aot_artifact,
}


def setup() -> None:
    """Process-wide settings every steady-state benchmark relies on."""
    torch.set_float32_matmul_precision(PRECISION)


if __name__ == "__main__":
    children = {"--cold": _cold_child, "--aot-export": _aot_export_child,
                "--aot-load": _aot_load_child}
    if len(sys.argv) == 3 and sys.argv[1] in children:
        print(json.dumps(children[sys.argv[1]](sys.argv[2])))
    else:
        sys.exit("usage: compile_path.py --cold {torchtpu,inductor} | --aot-export PATH | "
                 "--aot-load PATH  (or run bench/run_all.py)")
