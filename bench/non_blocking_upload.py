"""``non_blocking=True`` uploads from pinned memory: do they return early, and overlap with
device work? The device check for item 3 of issue 16 (on a TPU), runnable here too.

For each of a few orders of a 64 MiB upload from pinned memory (blocking or non_blocking) and a
device program (a chain of 1024^3 float32 matmuls), prints the median time until the issuing
calls return and until ``torch.tpu.synchronize()`` returns. Overlap shows as a non_blocking
row finishing sooner than the blocking one (at best: the program's time alone).

The source is a whole pinned tensor (what ``DataLoader(pin_memory=True)`` gives) unless
``--offset``: on the CPU client a whole pinned tensor is 64-byte aligned and copied during the
call anyway (``docs/eager.md``), and only an offset view of pinned memory is copied on the
client's threads.

Run: ``.venv/bin/python bench/non_blocking_upload.py [--offset] [--rounds 7]``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offset", action="store_true",
                        help="upload an offset view of pinned memory (not 64-byte aligned)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()

    import torch

    import torchtpu_eager  # noqa: F401  (registers the device)
    from torchtpu_compile import config
    from torchtpu_compile.runtime.client import get_client

    n = args.mib * 1024 * 1024 // 4
    pinned = torch.randn(n + 1).pin_memory()
    src = pinned[1:] if args.offset else pinned[:n]
    a = torch.randn(1024, 1024, device="tpu")

    def program():
        z = a
        for _ in range(4):
            z = z @ a
        return z

    rows = {
        "program alone": program,
        "upload alone, blocking": lambda: src.to("tpu"),
        "upload alone, non_blocking": lambda: src.to("tpu", non_blocking=True),
        "blocking upload, then program": lambda: (src.to("tpu"), program()),
        "non_blocking upload, then program":
            lambda: (src.to("tpu", non_blocking=True), program()),
        "program, then blocking upload": lambda: (program(), src.to("tpu")),
        "program, then non_blocking upload":
            lambda: (program(), src.to("tpu", non_blocking=True)),
    }

    def timed(fn):
        start = time.perf_counter()
        keep = fn()  # noqa: F841  (results stay alive: synchronize waits for live buffers)
        issued = time.perf_counter()
        torch.tpu.synchronize()
        return issued - start, time.perf_counter() - start

    with config.patch(matmul_precision="highest"):
        for fn in rows.values():  # compile and warm up
            timed(fn)
        samples = {name: [] for name in rows}
        for _ in range(args.rounds):
            for name, fn in rows.items():
                samples[name].append(timed(fn))
    print(f"platform {get_client().platform}, {args.mib} MiB, "
          f"{'offset view' if args.offset else 'whole pinned tensor'}, "
          f"median of {args.rounds}, load {os.getloadavg()[0]:.1f}")
    for name, values in samples.items():
        issued = statistics.median(i for i, _ in values)
        done = statistics.median(d for _, d in values)
        print(f"  {name:36s} issued {issued * 1e3:8.1f} ms   done {done * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
