"""End-to-end training steps of the migration suite's scripts, against eager CPU and Inductor.

- the transformer LM loop of ``tests/migration/transformer_lm.py`` (activation checkpointing,
  AdamW(fused=True), gradient clipping), one step at a time, on the tpu device in each eager
  mode (strict, defer-and-fuse) and compiled with ``backend="torchtpu"``; eager CPU and
  Inductor (``torch.compile`` on CPU) run the same step in the same process, interleaved;
- a Hugging Face ``Trainer`` step on a small random-init Llama, each contender in a fresh
  process (Trainer keeps process-wide state), timed per optimizer step by a callback after the
  first steps (compiles) are done.

Rows report torchtpu's step time against both references; no target is set by the issue, so
the rows carry no PASS/MISS.

Run alone: ``.venv/bin/python bench/run_all.py --only migration_lm --only migration_trainer``.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

from common import interleaved, result, run_fresh_child  # noqa: E402

#: The LM: bigger than the migration test's (which is sized for speed), small enough that the
#: 2-core machine runs a step in tens of milliseconds.
LM = dict(vocab=256, dim=128, heads=4, layers=2, context=64)
LM_BATCH = (8, 64)


def _lm_module():
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from tests.migration import transformer_lm
    return transformer_lm


def _lm_contender(device: str, compile_backend: str | None):
    import torch
    lm = _lm_module()
    torch.manual_seed(1)
    model = lm.GPT(**LM).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    step_model = torch.compile(model, backend=compile_backend) if compile_backend else model
    torch.manual_seed(0)
    batch = torch.randint(0, LM["vocab"], (LM_BATCH[0], LM_BATCH[1] + 1))
    x, y = batch[:, :-1].contiguous().to(device), batch[:, 1:].contiguous().to(device)
    model.train()

    def step():
        _, loss = step_model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.item()
    return step


def _in_eager_mode(mode: str, step):
    import torch

    def run():
        torch.tpu.set_eager_mode(mode)
        try:
            return step()
        finally:
            torch.tpu.set_eager_mode("strict")
    return run


def bench_lm_step(quick: bool) -> list[dict]:
    """One training step of the migration LM: tpu strict, defer-and-fuse and compiled, against
    eager CPU and Inductor, interleaved in one process."""
    import torchtpu_eager  # noqa: F401
    fns = {
        "eager": _lm_contender("cpu", None),
        "inductor": _lm_contender("cpu", "inductor"),
        "strict": _lm_contender("tpu", None),
        "fuse": _in_eager_mode("defer_and_fuse", _lm_contender("tpu", None)),
        "compiled": _lm_contender("tpu", "torchtpu"),
    }
    times, busy = interleaved(fns, rounds=3 if quick else 9, inner=2 if quick else 3, warmup=3)
    shape = (f"GPT {LM['layers']} layers, d={LM['dim']}, batch {LM_BATCH[0]}x{LM_BATCH[1]}, "
             f"activation checkpointing, AdamW(fused=True), clipping")
    rows = []
    for key, label in (("strict", "eager strict"), ("fuse", "defer-and-fuse"),
                       ("compiled", "torch.compile(backend='torchtpu')")):
        rows.append(result(f"LM train step, tpu {label}",
                           {"eager": times["eager"], "inductor": times["inductor"],
                            "torchtpu": times[key]},
                           notes=[shape] if key == "strict" else [], others_cpu=busy))
    return rows


# ----------------------------------------------------------------- Hugging Face Trainer step

TRAINER_CONTENDERS = {  # label -> (device, compile backend)
    "eager": ("cpu", None),
    "inductor": ("cpu", "inductor"),
    "tpu eager": ("tpu", None),
    "tpu compiled": ("tpu", "torchtpu"),
}


def _trainer_child(label: str, steps: int) -> dict:
    device, backend = TRAINER_CONTENDERS[label]
    if device == "tpu":
        # accelerate moves batches to the device it picks from a fixed list; this is its own
        # switch (see tests/migration/hf_trainer.py).
        os.environ["ACCELERATE_TORCH_DEVICE"] = "tpu"
    import tempfile

    import torch
    from torch._dynamo.utils import counters
    from torch.utils.data import Dataset
    from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                              TrainingArguments)

    def programs_compiled():
        if device != "tpu":
            return 0
        import torchtpu_compile
        return torchtpu_compile.stats()["eager_programs_compiled"]

    class RandomTokens(Dataset):
        def __len__(self):
            return 4 * steps

        def __getitem__(self, i):
            ids = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.times, self.frames, self.programs, self._start = [], [], [], None

        def on_step_begin(self, args, state, control, **kwargs):
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self._start)
            self.frames.append(counters["frames"]["ok"])
            self.programs.append(programs_compiled())

    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    if backend:
        model.compile(backend=backend)
    timer = StepTimes()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=4,
                                 max_steps=steps, report_to=[], save_strategy="no",
                                 logging_strategy="no", use_cpu=device == "cpu",
                                 dataloader_pin_memory=False)
        trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(),
                          callbacks=[timer])
        trainer.train()
    steady = timer.times[3:]  # the first steps compile (Inductor and torchtpu alike)
    return {"step": statistics.median(steady), "device": str(args.device),
            "recompiles_after_warmup": timer.frames[-1] - timer.frames[2],
            "eager_programs_after_warmup": timer.programs[-1] - timer.programs[2]}


def bench_trainer_step(quick: bool) -> list[dict]:
    """A Trainer optimizer step (AdamW, the Trainer's default) on a small Llama: tpu eager and
    compiled against CPU eager and Inductor, each in a fresh process."""
    steps = 8 if quick else 16
    out = {label: run_fresh_child(__file__, label, label, steps) for label in TRAINER_CONTENDERS}
    wrong = [f"{label} trained on {o['device']}" for label, o in out.items()
             if o["device"].split(":")[0] != TRAINER_CONTENDERS[label][0]]
    wrong += [f"{label}: {o['recompiles_after_warmup']} frames compiled after warm-up"
              for label, o in out.items() if o["recompiles_after_warmup"]]
    wrong += [f"{label}: {o['eager_programs_after_warmup']} eager programs compiled after "
              f"warm-up" for label, o in out.items() if o["eager_programs_after_warmup"]]
    notes = [f"Llama 2 layers, d=128, batch 4x64, median of {steps - 3} steps after 3 warm-up"]
    return [
        result(f"Trainer step, tpu {kind}",
               {"eager": out["eager"]["step"], "inductor": out["inductor"]["step"],
                "torchtpu": out[label]["step"]},
               notes=(notes + wrong) if kind == "eager" else [],
               status="MISS" if wrong else None)
        for kind, label in (("eager", "tpu eager"), ("compiled", "tpu compiled"))
    ]


BENCHMARKS = {"migration_lm": bench_lm_step, "migration_trainer": bench_trainer_step}


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    print(json.dumps(_trainer_child(sys.argv[2], int(sys.argv[3]))))
