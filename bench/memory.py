"""Peak memory of a compiled training step: torchtpu against eager PyTorch and Inductor.

Each contender runs in a fresh process (peak RSS is per process): an HF GPT-2 (6 layers, width
512, GPT-2's vocabulary), batch 4 x 256 tokens, AdamW, the whole step under ``torch.compile``
(forward, ``loss.backward()``, ``optimizer.step()``, ``zero_grad``). Imports are excluded: the
figure is the process's peak resident set (``VmHWM``) less its resident set after the imports
(torch, transformers, and for torchtpu jax and its PJRT client). Two peaks per run: over the
first three steps (compiles included) and over steps 4-5 alone (steady state: the peak is reset
between, ``/proc/self/clear_refs``). For torchtpu the live PJRT buffer figures
(``runtime/memory.py``) are reported too.

A second row runs the same step with the model on the eager tpu device (``--child
torchtpu-device``), once with buffer donation (the default) and once without
(``TORCHTPU_DONATE_BUFFERS=0``), and compares the peaks of live device memory.

Run one by hand with ``python bench/memory.py --child torchtpu``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import OtherLoad, result  # noqa: E402

#: torchtpu's peak over Inductor's, imports excluded (lower is better).
TARGET_PEAK = 1.0
MB = 1 << 20


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> bool:
    """Start the process's peak RSS again from its current RSS (Linux: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def gpt2_train_model():
    """HF GPT-2, 6 layers, width 512, 8 heads, GPT-2's vocabulary; batch 4 x 256; no dropout."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=512, n_layer=6, n_head=8, n_positions=256, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    model = GPT2LMHeadModel(cfg).train()
    model.loss_type = "ForCausalLM"  # no warning from inside forward (a graph break)
    return model, torch.randint(0, cfg.vocab_size, (4, 256))


def _child(contender: str) -> dict:
    import torch
    import transformers  # noqa: F401  (imports before the baseline, for every contender)
    torch.set_float32_matmul_precision("highest")
    on_device = contender == "torchtpu-device"  # the model on the eager tpu device
    if on_device:
        contender = "torchtpu"
    if contender == "torchtpu":
        import torchtpu_compile
        from torchtpu_compile.runtime import memory
        from torchtpu_compile.runtime.client import get_client
        get_client()
    baseline = _status_kb("VmRSS")
    can_reset = _reset_peak()
    model, ids = gpt2_train_model()
    if on_device:
        model, ids = model.to("tpu"), ids.to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(ids):
        loss = model(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    if contender != "eager":
        step = torch.compile(step, backend=contender)
    losses = [step(ids).item() for _ in range(3)]
    first_peak = _status_kb("VmHWM")
    if contender == "torchtpu":
        memory.reset_peaks()
    _reset_peak()
    losses += [step(ids).item() for _ in range(2)]
    out = {"baseline_bytes": baseline, "first_peak_bytes": first_peak - baseline,
           "steady_peak_bytes": _status_kb("VmHWM") - baseline, "peak_reset": can_reset,
           "losses": losses}
    if contender == "torchtpu":
        out["device"] = memory.snapshot()
        out["stats"] = {k: v for k, v in torchtpu_compile.stats().items()
                        if isinstance(v, (int, float))}
        out["donation"] = torchtpu_compile.stats()["donation"]
    return out


def _run_child(contender: str, env: dict | None = None) -> dict:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", contender],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{contender} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_train_peak(quick: bool) -> list[dict]:
    """Peak RSS of the compiled AdamW step, torchtpu against Inductor and eager."""
    with OtherLoad() as load:
        runs = {name: _run_child(name) for name in ("torchtpu", "inductor", "eager")}
    first = {name: r["first_peak_bytes"] for name, r in runs.items()}
    steady = {name: r["steady_peak_bytes"] for name, r in runs.items()}
    ratio = first["torchtpu"] / first["inductor"]
    device = runs["torchtpu"]["device"]
    row = result("gpt2 AdamW step peak memory (MB over imports)",
                 {name: value / MB for name, value in first.items()}, notes=[
                     "peak RSS over the first 3 steps (compiles included) less RSS after "
                     "imports: " + ", ".join(f"{n} {v / MB:.0f} MB" for n, v in first.items())
                     + f"; torchtpu / inductor {ratio:.2f}x (target <= {TARGET_PEAK})",
                     "steady state (steps 4-5): " + ", ".join(
                         f"{n} {v / MB:.0f} MB" for n, v in steady.items())
                     + f"; torchtpu / inductor {steady['torchtpu'] / steady['inductor']:.2f}x",
                     f"torchtpu live PJRT buffers, steps 4-5: peak "
                     f"{device['peak_allocated_bytes'] / MB:.0f} MB, now "
                     f"{device['allocated_bytes'] / MB:.0f} MB",
                     "losses (first, last): " + ", ".join(
                         f"{n} {r['losses'][0]:.4f}/{r['losses'][-1]:.4f}"
                         for n, r in runs.items()),
                 ], target=TARGET_PEAK, others_cpu=load.share)
    row["unit"] = "MB"  # "seconds" holds megabytes in this row
    return [row]


def bench_device_train_peak(quick: bool) -> list[dict]:
    """Peak live device memory of the compiled AdamW step on the eager tpu device (parameters,
    gradients and optimizer state are PJRT buffers), with buffer donation and without."""
    with OtherLoad() as load:
        runs = {"donated": _run_child("torchtpu-device"),
                "undonated": _run_child("torchtpu-device", {"TORCHTPU_DONATE_BUFFERS": "0"})}
    peak = {name: r["device"]["peak_allocated_bytes"] for name, r in runs.items()}
    ratio = peak["donated"] / peak["undonated"]
    row = result("gpt2 AdamW step on the tpu device, peak device memory (MB)",
                 {name: value / MB for name, value in peak.items()}, notes=[
                     "peak live PJRT buffer bytes over steps 4-5 (runtime/memory.py; the "
                     "platform allocator's figure on TPU): " + ", ".join(
                         f"{n} {v / MB:.0f} MB" for n, v in peak.items())
                     + f"; donated / undonated {ratio:.2f}x (target < 1)",
                     "peak RSS over imports, steps 4-5: " + ", ".join(
                         f"{n} {r['steady_peak_bytes'] / MB:.0f} MB" for n, r in runs.items()),
                     "inputs donated per run: " + ", ".join(
                         f"{n} {r['donation']['donated_inputs']}" for n, r in runs.items()),
                     "losses (first, last): " + ", ".join(
                         f"{n} {r['losses'][0]:.4f}/{r['losses'][-1]:.4f}"
                         for n, r in runs.items()),
                 ], target=1.0, others_cpu=load.share)
    row["unit"] = "MB"
    return [row]


BENCHMARKS = {"train_peak_memory": bench_train_peak,
              "device_train_peak_memory": bench_device_train_peak}

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2])))
    else:
        for bench in BENCHMARKS.values():
            for row in bench(quick=True):
                print(json.dumps(row, indent=1))
