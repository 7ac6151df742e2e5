"""The issue-17 generate() runs: a tiny random-init Llama (2 layers, d=128) and GPT-2 with
``model.forward = torch.compile(model.forward, backend="torchtpu")``, three prompts of different
lengths, tokens identical to eager's, and compiles per graph bounded by the buckets touched.
Then greedy decoding on ten other decoder-only architectures, and the modes beyond greedy
(docs/coverage.md, "generate() modes"): beam search, the logits processors under sampling, and
the encoder-decoders T5 and Whisper."""
from __future__ import annotations

import pytest
import torch

import torchtpu_compile
from tests.support import zoo
from torchtpu_compile import config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_dynamo")]


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
                      eos_token_id=2)
    return LlamaForCausalLM(cfg).eval()


def _gpt2():
    return zoo.gpt2()[0].eval()


def _prompt(length: int, batch: int) -> dict:
    ids = torch.randint(3, 100, (batch, length))
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(1, batch):  # left padding, as decoder-only batches are
        ids[row, : 2 * row] = 0
        mask[row, : 2 * row] = 0
    return dict(input_ids=ids, attention_mask=mask)


def _compiles() -> int:
    return sum(g["compiles"] for g in torchtpu_compile.stats()["graphs"].values())


def _run(model, new_tokens: int, batch: int = 1, sample: bool = False, **generate):
    """Generate for prompts of 7, 13 and 21 tokens eagerly, then compiled; then for prompts of
    10 and 18, whose buckets exist by then: those compile nothing."""
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=sample,
                  **generate)
    torch.manual_seed(1)
    first, later = [_prompt(n, batch) for n in (7, 13, 21)], [_prompt(n, batch) for n in (10, 18)]

    def generate_all(prompts):
        out = []
        for prompt in prompts:
            torch.manual_seed(2)  # sampling draws the same numbers in both runs
            out.append(model.generate(**prompt, **kwargs))
        return out

    with torch.no_grad(), config.patch(matmul_precision="highest"):
        expected = generate_all(first + later)
        model.forward = torch.compile(model.forward, backend="torchtpu")
        for got, want in zip(generate_all(first), expected):
            assert torch.equal(got, want)
        before = _compiles()
        for got, want in zip(generate_all(later), expected[len(first):]):
            assert torch.equal(got, want)
        assert _compiles() == before
    stats = torchtpu_compile.stats()
    assert stats["buckets"]["exact_shape_compiles"] == 0
    assert max(g["compiles"] for g in stats["graphs"].values()) <= 8, stats["graphs"]
    return stats


def test_llama_greedy_dynamic_cache_48_tokens():
    stats = _run(_llama(), 48)
    # the decode step: cache lengths 7..68 in buckets 8..128
    assert max(g["compiles"] for g in stats["graphs"].values()) == 5


def test_llama_greedy_static_cache():
    _run(_llama(), 16, cache_implementation="static")


def test_llama_padded_batch_with_attention_mask():
    _run(_llama(), 16, batch=2)


def test_llama_sampling_under_manual_seed():
    _run(_llama(), 16, sample=True)


def test_gpt2_greedy_dynamic_cache():
    _run(_gpt2(), 16)


def test_gpt2_static_cache_padded_batch():
    _run(_gpt2(), 16, batch=2, cache_implementation="static")


_TINY = dict(vocab_size=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_ROTARY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
_HEADS = dict(num_hidden_layers=2, num_attention_heads=4)
#: Decoder-only architectures whose attention differs from Llama's, as config class and model
#: class names in transformers, with tiny configs.
ARCHITECTURES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _ROTARY),  # biased q/k/v
    "mistral": ("MistralConfig", "MistralForCausalLM", _ROTARY),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(_ROTARY, head_dim=32)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",  # sliding window layers, soft-capping
               dict(_ROTARY, head_dim=32, sliding_window=16)),
    "phi": ("PhiConfig", "PhiForCausalLM",  # partial rotary, parallel blocks
            dict(_HEADS, hidden_size=128, intermediate_size=256)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                 dict(_HEADS, hidden_size=128, intermediate_size=256)),
    "opt": ("OPTConfig", "OPTForCausalLM",  # learned positions from the mask's cumsum
            dict(_HEADS, hidden_size=128, ffn_dim=256, word_embed_proj_dim=128)),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=128, n_layer=2, n_head=4)),
    "falcon": ("FalconConfig", "FalconForCausalLM",  # multi-query, fused q/k/v
               dict(_HEADS, hidden_size=128)),
    "gptj": ("GPTJConfig", "GPTJForCausalLM",
             dict(n_embd=128, n_layer=2, n_head=4, n_positions=512, rotary_dim=16)),
}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_greedy_dynamic_cache_on_other_architectures(name):
    import transformers
    config_class, model_class, sizes = ARCHITECTURES[name]
    torch.manual_seed(0)
    cfg = getattr(transformers, config_class)(**_TINY, **sizes)
    stats = _run(getattr(transformers, model_class)(cfg).eval(), 16)
    # lengths 7..37 touch buckets 8, 16, 32 and 64 at most. Falcon's decode step, before its
    # unread size input stopped picking buckets, compiled one program per pair of buckets.
    assert max(g["compiles"] for g in stats["graphs"].values()) <= 4, stats["graphs"]


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration
    torch.manual_seed(0)
    return T5ForConditionalGeneration(T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, dropout_rate=0.0)).eval()


def _whisper():
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    torch.manual_seed(0)
    return WhisperForConditionalGeneration(WhisperConfig(
        vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=16, max_target_positions=32,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=0,
        begin_suppress_tokens=None, suppress_tokens=None)).eval()


def _same_as_eager(model, inputs: dict, modes: list) -> None:
    """generate() with the compiled forward gives eager's tokens, seed for seed, for each of
    ``modes`` (generate's keyword arguments), with no compile per exact shape."""
    runs = [dict(max_new_tokens=8, min_new_tokens=8, **each) for each in modes]

    def generate_all():
        out = []
        for kwargs in runs:
            torch.manual_seed(2)
            out.append(model.generate(**inputs, **kwargs))
        return out

    with torch.no_grad(), config.patch(matmul_precision="highest"):
        expected = generate_all()
        model.forward = torch.compile(model.forward, backend="torchtpu")
        for got, want, kwargs in zip(generate_all(), expected, runs):
            assert torch.equal(got, want), kwargs
    assert torchtpu_compile.stats()["buckets"]["exact_shape_compiles"] == 0


_BEAMS = dict(do_sample=False, num_beams=3, num_return_sequences=2)


def test_llama_beam_search_and_logits_processors_left_padded():
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    _same_as_eager(zoo.llama()[0].eval(), dict(input_ids=ids, attention_mask=mask), modes=[
        _BEAMS, dict(_BEAMS, early_stopping=True), dict(do_sample=True, num_beams=3),
        dict(do_sample=True, top_k=10, temperature=0.7), dict(do_sample=True, top_p=0.9),
        dict(do_sample=True, repetition_penalty=1.3, no_repeat_ngram_size=2,
             bad_words_ids=[[5], [7, 8]])])


def test_t5_greedy_and_beam_search_right_padded():
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    ids[1, -3:], mask[1, -3:] = 0, 0
    _same_as_eager(_t5(), dict(input_ids=ids, attention_mask=mask),
                   modes=[dict(do_sample=False), _BEAMS, dict(do_sample=True, top_k=10)])


def test_whisper_greedy_and_beam_search():
    features = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(5))
    _same_as_eager(_whisper(), dict(input_features=features),
                   modes=[dict(do_sample=False), _BEAMS])
