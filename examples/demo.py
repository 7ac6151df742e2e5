"""`make run`: a GPT-2-style model (random init) through torch.compile(backend="torchtpu").

Prints the PJRT platform, the matmul precision, the first-call (compile) time, steady-state
latency against eager PyTorch, and the max error against eager, for inference and a training
step.
"""
from __future__ import annotations

import copy
import statistics
import time

import torch

import torchtpu_compile


def build_model():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=1000, n_embd=256, n_layer=4, n_head=4, n_positions=256,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                        bos_token_id=0, eos_token_id=1, pad_token_id=1)
    model = GPT2LMHeadModel(config)
    tokens = torch.randint(0, config.vocab_size, (4, 128))
    return model, tokens


def median_ms(fn, repeats=20):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main():
    model, tokens = build_model()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="torchtpu")

    from torchtpu_compile.lower.precision import resolve_precision
    from torchtpu_compile.runtime.client import get_client
    platform = get_client().platform
    precision = resolve_precision(platform)
    print("torchtpu demo: GPT-2 (4 layers, d=256, vocab 1000), batch 4 x 128 tokens")
    print(f"  PJRT platform      : {platform} ({get_client().device})")
    print(f"  matmul precision   : {precision} (bf16 multiply, f32 accumulate)"
          if precision == "medium" else f"  matmul precision   : {precision}")

    with torch.no_grad():
        model.eval(), eager.eval()
        start = time.perf_counter()
        out = compiled(tokens).logits
        first = time.perf_counter() - start
        ref = eager(tokens).logits
        error = (out - ref).abs().max().item()
        scale = ref.abs().max().item()
        for _ in range(3):
            compiled(tokens), eager(tokens)
        ours = median_ms(lambda: compiled(tokens))
        theirs = median_ms(lambda: eager(tokens))
    stats = torchtpu_compile.stats()
    print("  inference")
    print(f"    first call       : {first:.2f} s (lowering {stats['lowering_seconds']:.2f} s,"
          f" XLA compile {stats['xla_compile_seconds']:.2f} s)")
    print(f"    steady state     : torchtpu {ours:.2f} ms | eager {theirs:.2f} ms "
          f"({theirs / ours:.2f}x eager speed)")
    print(f"    max |error|      : {error:.2e} (outputs up to {scale:.2f})")

    model.train(), eager.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-3)

    def step(m, o, fn):
        o.zero_grad()
        loss = fn(tokens, labels=tokens).loss
        loss.backward()
        o.step()
        return loss.item()

    start = time.perf_counter()
    losses = [step(model, opt, compiled)]
    first = time.perf_counter() - start
    eager_losses = [step(eager, eager_opt, eager)]
    for _ in range(4):
        losses.append(step(model, opt, compiled))
        eager_losses.append(step(eager, eager_opt, eager))
    ours = median_ms(lambda: step(model, opt, compiled), repeats=5)
    theirs = median_ms(lambda: step(eager, eager_opt, eager), repeats=5)
    print("  training (AdamW)")
    print(f"    first step       : {first:.2f} s")
    print(f"    steady step      : torchtpu {ours:.2f} ms | eager {theirs:.2f} ms "
          f"({theirs / ours:.2f}x eager speed)")
    print("    losses torchtpu  : " + " ".join(f"{l:.4f}" for l in losses))
    print("    losses eager     : " + " ".join(f"{l:.4f}" for l in eager_losses))
    print(f"    max |loss error| : {max(abs(a - b) for a, b in zip(losses, eager_losses)):.2e}")
    stats = torchtpu_compile.stats()
    print(f"  stats: {stats['graphs_compiled']} graphs compiled, {stats['cache_hits']} cache hits,"
          f" fallback ops: {stats['fallback_ops'] or 'none'}")


if __name__ == "__main__":
    main()
