"""What index bounds checks cost per call: each program built with and without them.

Not part of run_all: a measurement for lower/index_checks.py. In one process, interleaved (see
common.py), it times

1. a compiled embedding lookup and linear layer, and compile_path.py's GPT-2 forward (CPU
   tensors: the check is read before the call returns), with ``config.check_indices`` on and
   off when the programs were built;
2. a compiled graph without indexing (``x + 1``): its program is the same either way;
3. the eager tpu device's ``x[i]`` (strict mode: the check output is kept for the next
   synchronization) and a whole step that ends in a download.

Usage: ``.venv/bin/python bench/index_checks.py``
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import fmt_time, interleaved, wait_for_idle  # noqa: E402


def _compiled(fn, checks: bool):
    """``fn`` compiled, its programs built with or without index checks. A copy of its code
    object: Dynamo caches compiled frames per code object."""
    import types

    import torchtpu_compile
    torchtpu_compile.config.check_indices = checks
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, None,
                              fn.__closure__)
    return torch.compile(copy, backend="torchtpu")


def _no_grad(fn, *args):
    with torch.no_grad():
        return fn(*args)


def main() -> None:
    torch.set_float32_matmul_precision("highest")
    import torchtpu_compile
    import torchtpu_eager  # noqa: F401  (the tpu device)

    torch.manual_seed(0)
    embedding = torch.nn.Embedding(1000, 64)
    linear = torch.nn.Linear(64, 64)

    def embed(ids):
        return linear(embedding(ids))

    def add_one(x):
        return x + 1

    ids = torch.randint(0, 1000, (4, 128))
    x = torch.randn(8)
    from compile_path import gpt2
    model, tokens = gpt2()

    def lm(tokens):
        return model(tokens).logits

    contenders = {}
    for checks in (False, True):
        embed_fn = _compiled(embed, checks)
        embed_fn(ids)
        add_fn = _compiled(add_one, checks)
        add_fn(x)
        lm_fn = _compiled(lm, checks)
        with torch.no_grad():
            lm_fn(tokens)
        label = "checked" if checks else "unchecked"
        contenders[f"compiled embedding+linear, {label}"] = lambda f=embed_fn: f(ids)
        contenders[f"compiled x + 1, {label}"] = lambda f=add_fn: f(x)
        contenders[f"compiled GPT-2 forward (4 x 128), {label}"] = \
            lambda f=lm_fn: _no_grad(f, tokens)
    torchtpu_compile.config.check_indices = True

    tpu_ids = ids.to("tpu")
    for checks in (False, True):
        # The eager device builds each op's program once, when first called: a table of its
        # own per setting (one row more) keeps the two programs apart.
        torchtpu_compile.config.check_indices = checks
        table = torch.randn(1000 + checks, 64).to("tpu")
        (table[tpu_ids] * 2).sum().item()
        label = "checked" if checks else "unchecked"
        contenders[f"eager tpu x[i], {label}"] = lambda t=table: t[tpu_ids]
        contenders[f"eager tpu (x[i] * 2).sum().item(), {label}"] = \
            lambda t=table: (t[tpu_ids] * 2).sum().item()
    torchtpu_compile.config.check_indices = True

    wait_for_idle(300)
    times, busy = interleaved(contenders, rounds=30, inner=20, warmup=5)
    print(f"median per call (other processes took {busy or 0:.0%} CPU):")
    for name, seconds in times.items():
        print(f"  {name:<48} {fmt_time(seconds):>10}")


if __name__ == "__main__":
    main()
