"""Hugging Face ``Trainer`` on a small random-init Llama (causal LM) or BERT (masked LM), as a
CUDA user runs it.

Diff from the CUDA version (the lines changed, nothing else)::

    +    os.environ["ACCELERATE_TORCH_DEVICE"] = "tpu"   # or in the shell, before Python starts
    +    model.compile(backend="torchtpu")                # only for the compiled run

Why the first line: transformers' ``TrainingArguments`` picks ``tpu:0`` and moves the model
there, but accelerate (which moves each batch) chooses its device from a fixed list of device
types and falls back to the CPU; ``ACCELERATE_TORCH_DEVICE`` is accelerate's own switch. Why the
second: ``TrainingArguments(torch_compile_backend=...)`` accepts only the names in accelerate's
``DynamoBackend`` enum; compiling the model before handing it to ``Trainer`` does the same.
A CUDA script's own ``TrainingArguments(torch_compile=True)`` (Inductor, the default backend)
runs unchanged too (``torch_compile`` below): torch.compile's default backend hands tpu graphs
to torchtpu.

``bf16`` (``TrainingArguments(bf16=True)``, autocast to bfloat16) and ``checkpointing``
(``gradient_checkpointing=True``) run unchanged too. ``fp16=True`` is refused by accelerate
(its fp16 device list has no "tpu"); ``fp16`` here shows the refusal (docs/migration.md).

Run it: ``ACCELERATE_TORCH_DEVICE=tpu python -m tests.migration.hf_trainer tpu [compile |
torch_compile] [bert] [bf16 | fp16] [checkpointing]``;
``python -m tests.migration.hf_trainer cpu [bert]`` for the reference. Prints one JSON line.
"""
from __future__ import annotations

import json
import sys
import tempfile

import torch
from torch.utils.data import Dataset


class RandomTokens(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        ids = torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


MASK_TOKEN = 3


class MaskedTokens(RandomTokens):
    """Masked-LM examples: a quarter of the tokens masked, the loss on those only."""

    def __getitem__(self, i):
        ids = super().__getitem__(i)["input_ids"]
        masked = torch.arange(8) % 4 == i % 4
        return {"input_ids": torch.where(masked, MASK_TOKEN, ids),
                "labels": torch.where(masked, ids, -100)}


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=32)
    torch.manual_seed(0)
    return LlamaForCausalLM(config), RandomTokens()


def bert():
    from transformers import BertConfig, BertForMaskedLM
    # Dropout 0: the tpu and CPU generators draw different masks.
    config = BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=32,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return BertForMaskedLM(config), MaskedTokens()


MODELS = {"llama": llama, "bert": bert}


def main(device: str, compiled: bool = False, model_name: str = "llama",
         torch_compile: bool = False, precision: str = "", checkpointing: bool = False) -> dict:
    from transformers import Trainer, TrainingArguments

    model, dataset = MODELS[model_name]()
    if compiled:
        model.compile(backend="torchtpu")
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=3,
                                 logging_steps=1, report_to=[], save_strategy="no",
                                 use_cpu=device == "cpu", torch_compile=torch_compile,
                                 bf16=precision == "bf16", fp16=precision == "fp16",
                                 gradient_checkpointing=checkpointing)
        trainer = Trainer(model=model, args=args, train_dataset=dataset)
        trainer.train()
    if model_name == "llama":
        prompt = torch.tensor([[1, 2, 3]]).to(args.device)
        sample = model.generate(prompt, max_new_tokens=3, do_sample=False).cpu().tolist()
    else:   # the masked LM's scores for the masked position of a prompt
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([[1, MASK_TOKEN, 2, 3]]).to(args.device)).logits
        sample = logits[0, 1].cpu().tolist()
    from torch._dynamo.utils import counters
    return {"device": str(args.device),
            "frames_compiled": counters["frames"]["ok"],
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "sample": sample}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], compiled="compile" in sys.argv[2:],
                          model_name="bert" if "bert" in sys.argv[2:] else "llama",
                          torch_compile="torch_compile" in sys.argv[2:],
                          precision=next((p for p in ("bf16", "fp16") if p in sys.argv[2:]), ""),
                          checkpointing="checkpointing" in sys.argv[2:])))
