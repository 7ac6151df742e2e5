"""Compile-path benchmarks: torchtpu against eager PyTorch and Inductor, measured in one run.

Every steady-state number comes from one process in which the three contenders run
interleaved (see ``common.interleaved``), so the ratios hold even when the machine's speed
drifts. The process runs with ``torch.set_float32_matmul_precision("highest")`` so that all
three do fp32 math (torchtpu's default, "medium", would emulate bf16 operands on CPU).

Cold compile times are the exception: each is measured in a fresh subprocess with empty
on-disk caches (``TORCHINDUCTOR_CACHE_DIR``, ``TORCHTPU_CACHE_DIR``), since in-process and disk
caches would otherwise answer.

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


def mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    """A 4-layer ReLU MLP, batch 64, width 1024."""
    torch.manual_seed(0)
    layers = []
    for i in range(4):
        layers.append(torch.nn.Linear(1024, 1024))
        if i < 3:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).eval(), torch.randn(64, 1024)


def gpt2() -> tuple[torch.nn.Module, torch.Tensor]:
    """A small random-init GPT-2 (4 layers, width 256), batch 4 x 128 tokens, no dropout.

    Bigger than tests/zoo.py's, so that compute is not lost in per-call overhead, and small
    enough that Inductor compiles it in well under a minute on two cores.
    """
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=1000, n_embd=256, n_layer=4, n_head=4, n_positions=128,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                     bos_token_id=0, eos_token_id=1, pad_token_id=1)
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
    """Steady-state inference latency of the MLP under no_grad."""
    model, x = mlp()
    with torch.no_grad():
        fns = {k: (lambda m=m: m(x)) for k, m in _compiled(model).items()}
        times, busy = interleaved(fns, rounds=8 if quick else 30, inner=3 if quick else 5)
    return [result("mlp forward (steady)", times, TARGET_STEADY, _fallback_note(),
                   others_cpu=busy)]


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


def _run_cold(backend: str) -> dict:
    """Run ``_cold_child`` in a new interpreter with empty on-disk compile caches."""
    env = dict(os.environ)
    cache_dir = tempfile.mkdtemp(prefix="bench_cold_cache_")
    env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    env["TORCHTPU_CACHE_DIR"] = cache_dir  # torchtpu's disk cache, where it has one
    env.pop("TORCHTPU_REMOTE_CACHE", None)
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--cold", backend],
                              env=env, capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"cold {backend} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


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


BENCHMARKS = {
    "mlp": bench_mlp,
    "gpt2_forward": bench_gpt2_forward,
    "gpt2_train": bench_gpt2_train,
    "overhead": bench_overhead,
    "cold_compile": bench_cold_compile,
}


def setup() -> None:
    """Process-wide settings every steady-state benchmark relies on."""
    torch.set_float32_matmul_precision(PRECISION)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--cold":
        print(json.dumps(_cold_child(sys.argv[2])))
    else:
        sys.exit("usage: compile_path.py --cold {torchtpu,inductor}  (or run bench/run_all.py)")
