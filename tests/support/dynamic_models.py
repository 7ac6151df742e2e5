"""Tiny hand-written transformers for the bounded-dynamism tests and benchmark.

Small enough that a bucket compiles in seconds, with the ops that padding must not leak
through: attention over the sequence (causal and bidirectional), layer norm, GELU, position
ids from ``arange``, a mean over the sequence, and a cross-entropy loss.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d: int, heads: int, causal: bool):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.ff(self.ln2(x))


class Decoder(nn.Module):
    """A causal language model: token ids (batch, seq) -> logits (batch, seq, vocab)."""

    def __init__(self, vocab=64, d=32, heads=4, layers=2, max_len=512):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads, causal=True) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class Encoder(nn.Module):
    """A bidirectional encoder: (batch, seq, features) -> (token states, mean-pooled state)."""

    def __init__(self, features=16, d=32, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Linear(features, d)
        self.blocks = nn.ModuleList(Block(d, heads, causal=False) for _ in range(layers))
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        x = self.ln(x)
        return x, x.mean(dim=1)


def lm_loss(logits, ids):
    """Next-token cross entropy (shifted by one along the sequence)."""
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))
