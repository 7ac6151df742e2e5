"""Greedy ``generate()`` of a compiled Hugging Face Llama, as a CUDA user writes it.

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"
    -    model.compile()
    +    model.compile(backend="torchtpu")

``generate()`` builds tensors on the model's device inside the compiled forward
(``torch.tensor(..., device=...)`` for its cache positions and masks): traced by Dynamo as
constants moved to the device.

With ``cache_implementation="static"`` (``... tpu static``) the script compiles nothing
itself and changes no line but the device: transformers compiles the decoding step on its own
for a "tpu" model, with ``backend="tpu"`` (the name our backend is also registered under).

Run it: ``python -m tests.migration.llama_generate tpu [static]``; ``... cpu`` (eager) for the
reference. Prints one JSON line.
"""
from __future__ import annotations

import json
import sys

import torch


def main(device: str, compiled: bool = True, new_tokens: int = 4, cache: str = "dynamic") -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=32)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device).eval()
    if compiled:
        model.compile(backend="torchtpu")
    prompt = torch.tensor([[1, 2, 3, 4]], device=device)
    with torch.no_grad():
        tokens = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False,
                                **({"cache_implementation": "static"} if cache == "static"
                                   else {}))
    from torch._dynamo.utils import counters

    from torchtpu_compile import stats
    return {"device": str(tokens.device), "tokens": tokens.cpu().tolist(),
            "graph_breaks": dict(stats()["graph_breaks"]),
            "frames_compiled": counters["frames"]["ok"]}


if __name__ == "__main__":
    cache = "static" if "static" in sys.argv[2:] else "dynamic"
    print(json.dumps(main(sys.argv[1], compiled=sys.argv[1] != "cpu" and cache == "dynamic",
                          cache=cache)))
