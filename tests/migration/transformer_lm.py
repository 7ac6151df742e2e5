"""A small GPT-style language-model training loop, as CUDA users write it (nanoGPT's shape).

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"
    -    model = torch.compile(model)
    +    model = torch.compile(model, backend="torchtpu")

Everything else is the CUDA script: activation checkpointing of every block
(``torch.utils.checkpoint``, non-reentrant as PyTorch recommends), AdamW with the ``fused`` or
``foreach`` flag as users pass it, ``model.to(torch.bfloat16)`` for pure-bf16 training, and
greedy sampling at the end. ``main(device)`` runs it and returns what
tests/migration/test_scripts.py compares against the same script on CPU.

Run it alone: ``python -m tests.migration.transformer_lm tpu``.
"""
from __future__ import annotations

import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        # No bias (as nanoGPT's default): a key bias has a zero gradient in exact arithmetic,
        # so AdamW turns rounding noise into full-size steps that no two devices agree on.
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, layers: int = 2,
                 context: int = 16, checkpointing: bool = True):
        super().__init__()
        self.checkpointing = checkpointing
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight   # weight tying
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            if self.checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.head(self.ln(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


@torch.no_grad()
def generate(model, idx, new_tokens):
    for _ in range(new_tokens):
        logits, _ = model(idx[:, -16:])
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


def main(device: str = "cuda", compiled: bool = True, optimizer_flag: str = "fused",
         dtype: str = "float32", steps: int = 4) -> dict:
    """Train ``steps`` steps on random tokens; return losses, parameters and a greedy sample.

    ``optimizer_flag``: "fused", "foreach" or "none" (the AdamW keyword a user passes);
    ``dtype``: "bfloat16" trains the model after ``model.to(torch.bfloat16)``.
    """
    torch.manual_seed(0)
    data = torch.randint(0, 64, (steps, 4, 17))
    torch.manual_seed(1)
    model = GPT().to(device)
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    flags = {"fused": {"fused": True}, "foreach": {"foreach": True}, "none": {}}[optimizer_flag]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95),
                                  weight_decay=0.1, **flags)
    step_model = torch.compile(model, backend="torchtpu") if compiled else model
    losses = []
    model.train()
    for batch in data:
        x, y = batch[:, :-1].contiguous().pin_memory(), batch[:, 1:].contiguous().pin_memory()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        _, loss = step_model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append((loss.item(), norm.item()))
    model.eval()
    sample = generate(step_model, data[0, :1, :4].to(device), 4)
    return {
        "losses": losses,
        "params": {k: v.detach().float().cpu() for k, v in model.state_dict().items()},
        "exp_avg_sq": [optimizer.state[p]["exp_avg_sq"].float().cpu()
                       for p in model.parameters()],
        "sample": sample.cpu(),
    }


if __name__ == "__main__":
    print(main(*sys.argv[1:2])["losses"])
