"""The issue-17 generate() runs: a tiny random-init Llama (2 layers, d=128) and GPT-2 with
``model.forward = torch.compile(model.forward, backend="torchtpu")``, three prompts of different
lengths, tokens identical to eager's, and compiles per graph bounded by the buckets touched."""
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
