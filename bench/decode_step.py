"""Where a decode step goes, in counts that do not depend on the machine's load.

Greedy ``generate()`` of the tiny Llama of ``generation.py`` (or another of its models, the
fourth argument; prompt 7, 16 new tokens), with
``model.forward`` compiled for a backend, after two warm-up generations; one more generation
runs under ``sys.setprofile`` and reports, per decode step: Python calls (by where they run:
transformers, Dynamo, aot_autograd, torchtpu, the rest of torch, other), C calls, ``copy_`` calls
between tensors (aot_autograd's write-back of a mutated KV cache) and their bytes, and for
torchtpu the uploads (host tensors put on the device: count and bytes) and downloads. Then the
median time per token of 5 more generations (noisy on a shared machine; compare counts), and
for torchtpu the wall and main-thread CPU per token of the whole step and of the XLA program's
execution (``Executable.run`` to its results being ready) over 5 more.

    python bench/decode_step.py torchtpu static        # or: inductor dynamic, eager static, ...
    python bench/decode_step.py torchtpu static tpu    # the model on the tpu device
    python bench/decode_step.py torchtpu dynamic cpu gpt2   # the tiny GPT-2
"""
from __future__ import annotations

import collections
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

NEW_TOKENS = 16
_PLACES = ("torchtpu", "transformers", "_dynamo", "_functorch", "torch/")


class _Transfers:
    """Counts the uploads and downloads of ``runtime/transfer.py`` (jaxlib entry points)."""

    def __init__(self):
        from torchtpu_compile.runtime import transfer
        self.counts = collections.Counter()
        self._transfer = transfer
        jax, to_dlpack, counts = transfer._jax, transfer._to_dlpack, self.counts

        class Jax:  # jaxlib's module, but for the device put that counts
            def __getattr__(self, name):
                return getattr(jax, name)

            @staticmethod
            def batched_device_put(aval, sharding, arrays, *rest, **kwargs):
                counts["uploads"] += 1
                counts["upload_bytes"] += arrays[0].nbytes
                return jax.batched_device_put(aval, sharding, arrays, *rest, **kwargs)

        def download(buffer):
            counts["downloads"] += 1
            return to_dlpack(buffer)

        transfer._jax, transfer._to_dlpack = Jax(), download


def _host_copies(generate) -> collections.Counter:
    """``copy_`` calls between two tensors (aot_autograd's write-back of a mutated input, the
    KV cache's) and their bytes, over one ``generate()`` (a run of its own: the wrapper's
    Python calls are not in the profiled one)."""
    import torch
    counts = collections.Counter()
    copy = torch.Tensor.copy_

    def counted(dst, src, *args, **kwargs):
        if dst is not src and isinstance(src, torch.Tensor):
            counts["copies"] += 1
            counts["copy_bytes"] += dst.numel() * dst.element_size()
        return copy(dst, src, *args, **kwargs)

    torch.Tensor.copy_ = counted
    try:
        generate()
    finally:
        torch.Tensor.copy_ = copy
    return counts


def _in_execute(generate, runs: int = 5) -> dict:
    """Per token over ``runs`` generations: wall and main-thread CPU of the whole step and of
    torchtpu's ``Executable.run`` (to its results being ready): the program against the rest."""
    from torchtpu_compile.runtime import executable
    spent = collections.Counter()
    run = executable.Executable.run

    def timed(self, buffers):
        wall, cpu = time.perf_counter(), time.thread_time()
        out = run(self, buffers)
        for buffer in out:
            getattr(buffer, "block_until_ready", lambda: None)()
        spent["wall"] += time.perf_counter() - wall
        spent["cpu"] += time.thread_time() - cpu
        return out

    executable.Executable.run = timed
    try:
        wall, cpu = time.perf_counter(), time.thread_time()
        for _ in range(runs):
            generate()
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    finally:
        executable.Executable.run = run
    tokens = runs * NEW_TOKENS
    return {"step_wall": wall / tokens * 1e3, "step_cpu": cpu / tokens * 1e3,
            "execute_wall": spent["wall"] / tokens * 1e3,
            "execute_cpu": spent["cpu"] / tokens * 1e3}


def main(backend: str, cache: str, device: str = "cpu", name: str = "llama") -> dict:
    import torch
    import torchtpu_compile
    from generation import MODELS
    torch.set_float32_matmul_precision("highest")
    torchtpu_compile.config.matmul_precision = "highest"
    torch.manual_seed(0)
    model = MODELS[name][0]().eval()
    ids = torch.randint(3, model.config.vocab_size, (1, 7))
    prompt = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
    if device != "cpu":
        model = model.to(device)
        prompt = {k: v.to(device) for k, v in prompt.items()}
    if backend != "eager":
        model.forward = torch.compile(model.forward, backend=backend)
    # disable_compile: with a static cache on a device other than the host, transformers
    # compiles forward itself, with backend=<device type> ("tpu", which is not ours).
    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                  disable_compile=True)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    transfers = _Transfers()
    python, c_calls = collections.Counter(), 0

    def profile(frame, event, arg):
        nonlocal c_calls
        if event == "call":
            name = frame.f_code.co_filename
            python[next((p for p in _PLACES if p in name), "other")] += 1
        elif event == "c_call":
            c_calls += 1

    with torch.no_grad():
        model.generate(**prompt, **kwargs)
        model.generate(**prompt, **kwargs)
        transfers.counts.clear()
        sys.setprofile(profile)
        model.generate(**prompt, **kwargs)
        sys.setprofile(None)
        moved = dict(transfers.counts)
        copied = _host_copies(lambda: model.generate(**prompt, **kwargs))
        times = []
        for _ in range(5):
            start = time.perf_counter()
            model.generate(**prompt, **kwargs)
            times.append(time.perf_counter() - start)
        ms = _in_execute(lambda: model.generate(**prompt, **kwargs)) \
            if backend == "torchtpu" else {}
    per_step = {k: round(v / NEW_TOKENS, 2) for k, v in python.items()}
    return {"model": name, "backend": backend, "cache": cache, "device": device,
            "python_calls": round(sum(python.values()) / NEW_TOKENS, 1), "by_place": per_step,
            "c_calls": round(c_calls / NEW_TOKENS, 1),
            "transfers": {k: round(v / NEW_TOKENS, 2) for k, v in moved.items()},
            "copies": {k: round(v / NEW_TOKENS, 2) for k, v in copied.items()},
            "ms_per_token": round(sorted(times)[2] / NEW_TOKENS * 1e3, 2),
            "ms_per_token_in_execute": {k: round(v, 3) for k, v in ms.items()},
            "load": round(os.getloadavg()[0], 1)}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
