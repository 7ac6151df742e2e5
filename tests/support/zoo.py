"""Tiny random-init models used by the tests, the demo and the benchmarks.

Each factory returns ``(model, example_inputs)``; weights come from a fixed seed, nothing is
downloaded.
"""
from __future__ import annotations

import torch

_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _seeded(fn):
    def make(seed: int = 0, **config):
        torch.manual_seed(seed)
        return fn(**config)
    make.__name__ = fn.__name__
    return make


def _ids(batch=2, seq=8, vocab=100):
    return torch.randint(0, vocab, (batch, seq))


@_seeded
def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                     bos_token_id=0, eos_token_id=1, pad_token_id=1)
    return GPT2LMHeadModel(cfg), (_ids(),)


@_seeded
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=100, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2, **_TINY)
    return LlamaForCausalLM(cfg), (_ids(),)


@_seeded
def qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=100, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2, **_TINY)
    return Qwen2ForCausalLM(cfg), (_ids(),)


@_seeded
def mistral():
    from transformers import MistralConfig, MistralForCausalLM
    cfg = MistralConfig(vocab_size=100, num_key_value_heads=2, max_position_embeddings=64,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2, **_TINY)
    return MistralForCausalLM(cfg), (_ids(),)


@_seeded
def bert():
    from transformers import BertConfig, BertForMaskedLM
    cfg = BertConfig(vocab_size=100, max_position_embeddings=64, pad_token_id=0, **_TINY)
    return BertForMaskedLM(cfg), (_ids(),)


@_seeded
def t5():
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, use_cache=False,
                   dropout_rate=0.0)
    return T5ForConditionalGeneration(cfg), (_ids(), None, _ids(seq=6))


@_seeded
def vit():
    from transformers import ViTConfig, ViTForImageClassification
    cfg = ViTConfig(image_size=32, patch_size=8, num_channels=3, num_labels=10, **_TINY)
    return ViTForImageClassification(cfg), (torch.randn(2, 3, 32, 32),)


@_seeded
def whisper():
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    cfg = WhisperConfig(vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2,
                        encoder_attention_heads=4, decoder_attention_heads=4,
                        encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
                        max_source_positions=16, max_target_positions=32,
                        pad_token_id=1, bos_token_id=0, eos_token_id=2,
                        decoder_start_token_id=0, use_cache=False)
    features = torch.randn(2, 16, 32)  # (batch, mel bins, frames = 2 * max_source_positions)
    return WhisperForConditionalGeneration(cfg), (features, None, _ids(seq=6))


@_seeded
def clip():
    from transformers import CLIPConfig, CLIPModel
    text = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=16, pad_token_id=1,
                bos_token_id=0, eos_token_id=2)
    vision = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=64)
    cfg = CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    return CLIPModel(cfg), (_ids(seq=8), torch.randn(2, 3, 32, 32))


TRANSFORMERS = {f.__name__: f for f in (gpt2, llama, qwen2, mistral, bert, t5, vit, whisper, clip)}


def first_tensor(output):
    """The main tensor of a model output (logits, or the first tensor field)."""
    if isinstance(output, torch.Tensor):
        return output
    for key in ("logits", "logits_per_image", "last_hidden_state"):
        value = getattr(output, key, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(output, (tuple, list)):
        return first_tensor(output[0])
    values = [v for v in output.values() if isinstance(v, torch.Tensor)]
    return values[0]
