"""Steady greedy ``generate()`` of ``generation.py``'s models, the contenders interleaved in one
process, so that a shared machine's drift hits them alike (``generation.py`` runs them one
after the other).

Each contender first runs ``generation.py``'s three prompts (7, 13 and 21 tokens, 64 new), then
the first prompt again; then ``rounds`` rounds each time every contender's ``generate()`` of
the first prompt, in alternating order. Reported per contender: the median wall time and
main-thread CPU time of one ``generate()``, and that CPU split into inside aot_autograd's
compiled function (the backend's call: our runner, or Inductor's kernels) and outside it
(Hugging Face's loop, Dynamo's frame and guards); a wall time above the CPU time is the main
thread waiting (for XLA's thread pool, for torchtpu).

``--model-state shared`` (the default) is ``generation.py``'s: one model for every contender,
so the static cache keeps the longest prompt's length (transformers keeps the largest
``max_cache_len`` it has made) and the decode graph is static. ``fresh``: a copy of the model
per contender, whose static cache grows with the prompts, so Dynamo makes its length dynamic
and the decode step runs through a bucket. ``--undo-kept``: a fourth contender, torchtpu with
the bucket runner's kept padding and in-place write-back of overwritten inputs turned off
(``buckets/kept_padding.py``, ``buckets/write_back.py``): the code before them, in the same
process, on the same compiled programs.

    python bench/generation_interleaved.py gpt2 static --model-state fresh --undo-kept
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))


def _inside_timer():
    """Main-thread CPU seconds spent inside aot_autograd's compiled functions (a dict whose
    "t" the caller zeroes), by wrapping their ``SerializableCompiledFunction.__call__``."""
    from torch._functorch._aot_autograd import runtime_wrappers
    inside = {"t": 0.0}
    cls = runtime_wrappers.SerializableCompiledFunction
    call = cls.__call__

    def timed(self, *args, **kwargs):
        start = time.thread_time()
        try:
            return call(self, *args, **kwargs)
        finally:
            inside["t"] += time.thread_time() - start

    cls.__call__ = timed
    return inside


def _undo_kept(on: bool) -> None:
    from torchtpu_compile.buckets import kept_padding, layout, runner
    if not hasattr(_undo_kept, "saved"):
        _undo_kept.saved = (kept_padding.KeptPadding.pad_all, runner.outputs_written)
    pad_all, written = _undo_kept.saved

    def fresh(self, inputs, plans):
        for j, plan, *_ in plans:
            inputs[j] = layout.pad_with(inputs[j], plan)

    kept_padding.KeptPadding.pad_all = fresh if on else pad_all
    runner.outputs_written = (lambda results, plans, _w, _a: layout.outputs_by(results, plans)) \
        if on else written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=("llama", "gpt2", "llama-large"))
    parser.add_argument("cache", choices=("dynamic", "static"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--model-state", choices=("shared", "fresh"), default="shared")
    parser.add_argument("--undo-kept", action="store_true")
    args = parser.parse_args()

    import torch
    import torchtpu_compile
    from generation import MODELS, NEW_TOKENS, PRECISION, PROMPT_LENGTHS, alternating
    torch._dynamo.config.cache_size_limit = 64  # two backends' entries on one code object
    torch.set_float32_matmul_precision(PRECISION)
    torchtpu_compile.config.matmul_precision = PRECISION
    torch.manual_seed(0)
    base = MODELS[args.model][0]().eval()
    prompts = []
    for length in PROMPT_LENGTHS:
        ids = torch.randint(3, base.config.vocab_size, (1, length))
        prompts.append(dict(input_ids=ids, attention_mask=torch.ones_like(ids)))
    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    if args.cache == "static":
        kwargs["cache_implementation"] = "static"

    def contender(backend: str):
        model = copy.deepcopy(base) if args.model_state == "fresh" else base
        forward = torch.compile(model.forward, backend=backend) if backend != "eager" \
            else model.forward

        def generate(prompt):
            model.__dict__["forward"] = forward
            try:
                return model.generate(**prompt, **kwargs)
            finally:
                model.__dict__.pop("forward")
        return generate

    runs = {b: contender(b) for b in ("eager", "inductor", "torchtpu")}
    if args.undo_kept:
        runs["torchtpu-undo-kept"] = runs["torchtpu"]
    inside = _inside_timer()
    with torch.no_grad():
        reference = None
        for name in ("eager", "inductor", "torchtpu"):
            tokens = [runs[name](p) for p in prompts]
            runs[name](prompts[0])
            reference = reference or tokens
            if not all(torch.equal(a, b) for a, b in zip(tokens, reference)):
                print(f"TOKENS DIFFER from eager's: {name}")
        wall, cpu, within = ({n: [] for n in runs} for _ in range(3))
        for name in alternating(runs, args.rounds):
            if args.undo_kept:
                _undo_kept(name == "torchtpu-undo-kept")
            inside["t"] = 0.0
            start, start_cpu = time.perf_counter(), time.thread_time()
            runs[name](prompts[0])
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.thread_time() - start_cpu)
            within[name].append(inside["t"])
    med = {n: {k: statistics.median(v[n]) * 1e3 for k, v in
               (("wall", wall), ("cpu", cpu), ("inside", within))} for n in runs}
    print(f"{args.model}, {args.cache} cache, model state {args.model_state}, {args.rounds} "
          f"rounds, load {os.getloadavg()[0]:.1f}; per generate() of {NEW_TOKENS} tokens "
          f"(ms, medians):")
    for name, m in med.items():
        print(f"  {name:20s} wall {m['wall']:7.1f}  main-thread cpu {m['cpu']:7.1f}  "
              f"inside {m['inside']:6.1f}  outside {m['cpu'] - m['inside']:6.1f}  "
              f"/inductor wall {m['wall'] / med['inductor']['wall']:.2f}x")
    graphs = torchtpu_compile.stats()["graphs"]
    print("  torchtpu graphs (compiles, buckets):",
          {g: (v["compiles"], v["buckets"]) for g, v in graphs.items()})


if __name__ == "__main__":
    main()
