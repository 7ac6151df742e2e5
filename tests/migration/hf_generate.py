"""Hugging Face ``generate()`` beyond greedy on a tiny random-init Llama, as a CUDA user runs it:
beam search, a repetition penalty, a left-padded batch with its attention mask, and sampling
with ``top_k``/``top_p``/``temperature`` under ``torch.manual_seed``.

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"
    -    model.compile()
    +    model.compile(backend="torchtpu")      # only for the compiled run

Sampled tokens are CPU's under the same seed, not just reproducible: tpu random ops draw on the
host from the tpu generator, a CPU generator that ``torch.manual_seed`` seeds too (CUDA's
Philox draws other numbers than the CPU's Mersenne Twister), so a script whose draws on each
device come in the same order samples CPU's tokens.

Run it: ``python -m tests.migration.hf_generate tpu [compile]`` (``TORCH_TPU_DEFER_AND_FUSE=1``
for defer-and-fuse); ``... cpu`` for the reference. Prints one JSON line.
"""
from __future__ import annotations

import json
import sys

import torch

MODES = {
    "greedy": dict(do_sample=False),
    "beams": dict(do_sample=False, num_beams=3, num_return_sequences=2),
    "repetition_penalty": dict(do_sample=False, repetition_penalty=1.5),
    "sampled": dict(do_sample=True, top_k=10, top_p=0.9, temperature=0.7),
}


def main(device: str, compiled: bool = False) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_float32_matmul_precision("highest")
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device).eval()
    if compiled:
        model.compile(backend="torchtpu")
    prompts = {"one": dict(input_ids=torch.tensor([[5, 6, 7, 8]], device=device)),
               "left_padded": dict(input_ids=torch.tensor([[0, 0, 5, 6], [9, 10, 11, 12]],
                                                          device=device),
                                   attention_mask=torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]],
                                                               device=device))}
    tokens = {}
    with torch.no_grad():
        for prompt, inputs in prompts.items():
            for mode, options in MODES.items():
                torch.manual_seed(42)
                out = model.generate(**inputs, **options, max_new_tokens=6, min_new_tokens=6)
                tokens[f"{prompt} {mode}"] = out.cpu().tolist()
    from torchtpu_compile import stats
    return {"device": str(out.device), "tokens": tokens,
            "eager_fallbacks": stats()["eager_fallbacks"],
            "graph_breaks": dict(stats()["graph_breaks"])}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], compiled="compile" in sys.argv[2:])))
