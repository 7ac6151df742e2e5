"""Decoding: Hugging Face greedy ``generate()`` with ``model.forward`` compiled.

For each model (tiny Llama, tiny GPT-2 and a larger Llama whose decode step is dominated by its
matmuls) and each KV cache (``dynamic``: transformers' default, growing by one token a step;
``static``: ``cache_implementation="static"``, preallocated), every contender (eager, Inductor
with automatic dynamic shapes, torchtpu) runs:

- three prompts of different lengths, 64 new tokens each, from a fresh compile cache: the total
  time, compiles included (what a user waits for the first time);
- then the first prompt again (untimed: it may compile once more);
- the steady time of one ``generate()`` of the first prompt, reported as tokens per second in
  the notes: the three contenders warmed up again side by side, then alternated round by round
  (``alternating``), the median of the rounds, so that a drift in the machine's speed hits
  them alike;
- compile counts: Dynamo graphs for Inductor; for torchtpu, programs built in all and at most
  per graph (a bucket each, or an exact shape), and XLA compilations.

Tokens are compared with eager's (greedy decoding is deterministic); a mismatch is noted.

Each model runs in a fresh process with empty compile caches. Within it, each contender's
three prompts run from nothing compiled (``torch._dynamo.reset()`` before each: what Dynamo
learned of another contender's shapes would spare it a recompile); the steady rounds follow.
Run one model by hand with ``python bench/generation.py --child llama 64 8`` (model, new
tokens, steady rounds).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import CONTENDERS, OtherLoad, result, run_fresh_child  # noqa: E402

PRECISION = "highest"
NEW_TOKENS = 64
QUICK_NEW_TOKENS = 16
PROMPT_LENGTHS = (7, 13, 21)
CACHES = ("dynamic", "static")
# Targets for torchtpu/inductor (lower is better), from issue 17.
TARGET_STEADY = 1.0
TARGET_TOTAL = 1.0
#: Target for the most programs torchtpu builds for one graph with the dynamic cache.
TARGET_COMPILES_PER_GRAPH = 8


def _llama(hidden: int, layers: int, intermediate: int, vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=hidden // 32,
                      num_key_value_heads=hidden // 64, max_position_embeddings=512,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(cfg)


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=256, n_embd=128, n_layer=2, n_head=4, n_positions=256,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1,
                     eos_token_id=2, pad_token_id=0)
    return GPT2LMHeadModel(cfg)


#: name -> (factory, description). "llama" is issue 17's tiny model (2 layers, d=128).
MODELS = {
    "llama": (lambda: _llama(128, 2, 256, 256), "tiny Llama (2 layers, d=128)"),
    "gpt2": (_gpt2, "tiny GPT-2 (2 layers, d=128)"),
    "llama-large": (lambda: _llama(1024, 4, 2816, 4096), "Llama 4 layers, d=1024 (63M params)"),
}
QUICK_MODELS = ("llama",)


def _compiles(stats: dict) -> tuple[int, int, int]:
    per_graph = [g["compiles"] for g in stats["graphs"].values()] or [0]
    return sum(per_graph), max(per_graph), stats["graphs_compiled"]


def alternating(names, rounds: int):
    """Each name once per round, the order reversed every other round, so that a drift in the
    machine's speed hits every contender alike.

    Example::

        for name in alternating(("eager", "inductor", "torchtpu"), 10):
            time_one(name)
    """
    names = list(names)
    for r in range(rounds):
        yield from (names if r % 2 == 0 else reversed(names))


def _generator(model, contender: str, kwargs: dict):
    """A ``generate(prompt)`` with ``model.forward`` compiled for ``contender`` (its own
    ``torch.compile`` wrapper, set on the model for the call only)."""
    import torch
    forward = model.forward if contender == "eager" else \
        torch.compile(model.forward, backend=contender)

    def generate(prompt):
        model.__dict__["forward"] = forward
        try:
            return model.generate(**prompt, **kwargs)
        finally:
            model.__dict__.pop("forward", None)
    return generate


def _warm(generate, prompts: list) -> tuple[list, float]:
    """The three prompts (timed as one: the tokens and the seconds), then the first prompt
    again, untimed: it can still compile once (Dynamo tries the graph made dynamic by the later
    prompts first; its bucket for this length is new)."""
    start = time.perf_counter()
    tokens = [generate(prompt) for prompt in prompts]
    total = time.perf_counter() - start
    generate(prompts[0])
    return tokens, total


def _first_runs(model, contender: str, prompts: list, kwargs: dict) -> dict:
    """The contender's three prompts from nothing compiled in this process (Dynamo reset:
    what it learned of the other contenders' shapes would spare this one a recompile), with
    its compile counts."""
    import torch
    import torchtpu_compile
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    torchtpu_compile.reset_stats()
    tokens, total = _warm(_generator(model, contender, kwargs), prompts)
    report = {"total": total, "tokens": tokens}
    if contender == "inductor":
        report["graphs"] = int(counters["stats"]["unique_graphs"])
    elif contender == "torchtpu":
        stats = torchtpu_compile.stats()
        report["compiles"], report["max_per_graph"], report["xla"] = _compiles(stats)
        report["graphs"] = len(stats["graphs"])
        report["exact_shape"] = stats["buckets"]["exact_shape_compiles"]
    return report


def _steady(model, prompts: list, kwargs: dict, rounds: int) -> tuple[dict, int]:
    """Median seconds of one ``generate()`` of the first prompt per contender, the contenders
    warmed up again side by side and then alternated round by round; and the programs torchtpu
    compiled during the timed rounds (0 unless a step recompiles)."""
    import torch
    import torchtpu_compile
    torch._dynamo.reset()
    limit = torch._dynamo.config.cache_size_limit
    torch._dynamo.config.cache_size_limit = 64  # three backends' entries on one code object
    try:
        runs = {c: _generator(model, c, kwargs) for c in CONTENDERS}
        for contender, generate in runs.items():
            if contender == "torchtpu":
                torchtpu_compile.reset_stats()
            _warm(generate, prompts)
        built = _compiles(torchtpu_compile.stats())[0]
        times = {c: [] for c in CONTENDERS}
        for contender in alternating(CONTENDERS, rounds):
            start = time.perf_counter()
            runs[contender](prompts[0])
            times[contender].append(time.perf_counter() - start)
    finally:
        torch._dynamo.config.cache_size_limit = limit
    steady_compiles = _compiles(torchtpu_compile.stats())[0] - built
    return {c: statistics.median(t) for c, t in times.items()}, steady_compiles


def _child(name: str, new_tokens: int, rounds: int) -> dict:
    import torch
    import torchtpu_compile
    sys.path.insert(0, os.path.dirname(HERE))
    torch.set_float32_matmul_precision(PRECISION)
    torchtpu_compile.config.matmul_precision = PRECISION
    torch.manual_seed(0)
    model = MODELS[name][0]().eval()
    prompts = []
    for length in PROMPT_LENGTHS:
        ids = torch.randint(3, model.config.vocab_size, (1, length))
        prompts.append(dict(input_ids=ids, attention_mask=torch.ones_like(ids)))
    out = {}
    for cache in CACHES:
        kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        if cache == "static":
            kwargs["cache_implementation"] = "static"
        with torch.no_grad():
            runs = {c: _first_runs(model, c, prompts, kwargs) for c in CONTENDERS}
            steady, runs["torchtpu"]["steady_compiles"] = _steady(model, prompts, kwargs,
                                                                  rounds)
        reference = runs["eager"].pop("tokens")
        for contender in CONTENDERS:
            runs[contender]["steady"] = steady[contender]
        for contender in ("inductor", "torchtpu"):
            tokens = runs[contender].pop("tokens")
            runs[contender]["same_tokens"] = all(torch.equal(a, b)
                                                 for a, b in zip(tokens, reference))
        out[cache] = runs
    return out


def _run_child(name: str, new_tokens: int, rounds: int) -> dict:
    return run_fresh_child(__file__, name, name, new_tokens, rounds)


def _rows(name: str, cache: str, runs: dict, new_tokens: int, others_cpu) -> list[dict]:
    label = f"generate {name}, {cache} cache"
    tpu, ind = runs["torchtpu"], runs["inductor"]
    per_second = ", ".join(f"{c} {new_tokens / runs[c]['steady']:.0f}" for c in CONTENDERS)
    wrong = [c for c in ("inductor", "torchtpu") if not runs[c]["same_tokens"]]
    notes = [f"{MODELS[name][1]}: tokens/s {per_second}",
             f"compiles: torchtpu {tpu['compiles']} programs for {tpu['graphs']} graphs (max "
             f"{tpu['max_per_graph']} per graph, {tpu['xla']} XLA, {tpu['exact_shape']} exact "
             f"shape); Inductor {ind['graphs']} graphs"]
    if wrong:
        notes.append(f"TOKENS DIFFER from eager's: {', '.join(wrong)}")
    if tpu["steady_compiles"]:
        notes.append(f"torchtpu compiled {tpu['steady_compiles']} programs during the steady "
                     f"runs")
    steady = result(f"{label}: steady ({new_tokens} tok)", {c: runs[c]["steady"]
                                                           for c in CONTENDERS},
                    TARGET_STEADY, notes, others_cpu=others_cpu)
    total = result(f"{label}: 3 prompts incl. compiles", {c: runs[c]["total"]
                                                          for c in CONTENDERS},
                   TARGET_TOTAL, others_cpu=others_cpu)
    if cache == "dynamic" and tpu["max_per_graph"] > TARGET_COMPILES_PER_GRAPH:
        total["status"] = "MISS"
        total["notes"].append(f"torchtpu built {tpu['max_per_graph']} programs for one graph "
                              f"(target <= {TARGET_COMPILES_PER_GRAPH})")
    return [steady, total]


def bench_generation(quick: bool) -> list[dict]:
    """Rows for run_all.py: steady generate() and 3 prompts incl. compiles, per model and
    cache (with --quick: the tiny Llama alone, 16 new tokens, one steady round)."""
    rows = []
    new_tokens = QUICK_NEW_TOKENS if quick else NEW_TOKENS
    for name in QUICK_MODELS if quick else MODELS:
        with OtherLoad() as load:
            report = _run_child(name, new_tokens, rounds=1 if quick else 8)
        for cache in CACHES:
            rows += _rows(name, cache, report[cache], new_tokens, load.share)
    return rows


BENCHMARKS = {"generation": bench_generation}


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
    else:
        for row in bench_generation("--quick" in sys.argv):
            print(json.dumps(row, indent=2))
