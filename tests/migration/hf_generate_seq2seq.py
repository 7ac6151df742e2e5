"""Hugging Face ``generate()`` of encoder-decoders on tiny random-init models, as a CUDA user runs
it: T5 (token ids in, a right-padded batch with its attention mask) and Whisper (log-mel
features in), greedy and beam search. Weights are initialised larger than the defaults so that
the tokens vary from step to step instead of repeating one token.

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"
    -    model.compile()
    +    model.compile(backend="torchtpu")      # only for the compiled run

Run it: ``python -m tests.migration.hf_generate_seq2seq tpu [compile]``
(``TORCH_TPU_DEFER_AND_FUSE=1`` for defer-and-fuse); ``... cpu`` for the reference. Prints one
JSON line.
"""
from __future__ import annotations

import json
import sys

import torch

MODES = {
    "greedy": dict(do_sample=False),
    "beams": dict(do_sample=False, num_beams=3, num_return_sequences=2),
    "beams_early_stopping": dict(do_sample=False, num_beams=3, early_stopping=True,
                                 length_penalty=0.5),
}


def _models():
    from transformers import (T5Config, T5ForConditionalGeneration, WhisperConfig,
                              WhisperForConditionalGeneration)
    torch.manual_seed(0)
    t5 = T5ForConditionalGeneration(T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, dropout_rate=0.0,
        initializer_factor=4.0))
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    ids[1, -3:], mask[1, -3:] = 0, 0
    torch.manual_seed(0)
    whisper = WhisperForConditionalGeneration(WhisperConfig(
        vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=16, max_target_positions=32,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=0,
        begin_suppress_tokens=None, suppress_tokens=None, init_std=0.3))
    features = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(5))
    return {"t5": (t5, dict(input_ids=ids, attention_mask=mask)),
            "whisper": (whisper, dict(input_features=features))}


def main(device: str, compiled: bool = False) -> dict:
    torch.set_float32_matmul_precision("highest")
    tokens = {}
    for name, (model, inputs) in _models().items():
        model = model.to(device).eval()
        if compiled:
            model.compile(backend="torchtpu")
        inputs = {key: value.to(device) for key, value in inputs.items()}
        with torch.no_grad():
            for mode, options in MODES.items():
                out = model.generate(**inputs, **options, max_new_tokens=8, min_new_tokens=8)
                tokens[f"{name} {mode}"] = out.cpu().tolist()
    from torchtpu_compile import stats
    return {"device": str(out.device), "tokens": tokens,
            "eager_fallbacks": stats()["eager_fallbacks"],
            "graph_breaks": dict(stats()["graph_breaks"])}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], compiled="compile" in sys.argv[2:])))
