"""Hugging Face generate() with torch.compile(model.forward): tokens as eager's, and the KV
cache growing by one each step served by a few padded buckets, not a compile per token.

Longer runs (48 new tokens, static cache, a padded batch, GPT-2):
tests/slow/test_generate_full.py.
"""
from __future__ import annotations

import torch

import torchtpu_compile
from tests.support import zoo
from torchtpu_compile import config


def _compiles() -> int:
    return sum(g["compiles"] for g in torchtpu_compile.stats()["graphs"].values())


def _generate(model, ids, new_tokens):
    return model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                          do_sample=False)


def test_greedy_generate_with_dynamic_cache_compiles_per_bucket(fresh_dynamo):
    model, _ = zoo.llama()
    model.eval()
    torch.manual_seed(1)
    prompts = [torch.randint(3, 100, (1, n)) for n in (4, 5, 6)]
    with torch.no_grad(), config.patch(matmul_precision="highest"):
        expected = [_generate(model, ids, 3) for ids in prompts]
        # dynamic=True: no static graph for the first prompt and step (the default, automatic
        # dynamic, is in tests/slow/test_generate_full.py)
        model.forward = torch.compile(model.forward, backend="torchtpu", dynamic=True)
        # prompt 4: the prompt and the cache lengths 4..6 each take bucket 8
        assert torch.equal(_generate(model, prompts[0], 3), expected[0])
        before = _compiles()
        # prompts of other lengths whose buckets exist compile nothing
        for ids, want in zip(prompts[1:], expected[1:]):
            assert torch.equal(_generate(model, ids, 3), want)
        assert _compiles() == before
    stats = torchtpu_compile.stats()
    assert stats["buckets"]["exact_shape_compiles"] == 0
    # one bucket each for the prompt's graph and the decode step's
    assert [g["buckets"] for g in stats["graphs"].values()] == [[[8]], [[8, 8]]], stats["graphs"]
