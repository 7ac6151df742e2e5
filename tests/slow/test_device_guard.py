"""The tpu device guard (native, torchtpu_compile/csrc/native.cpp) against CPU: an exception
raised while the autograd engine runs a tpu backward reaches the caller, as on CPU.

PyTorch's Python-backed guard was called from noexcept code while the exception was pending,
and the process aborted ("terminate called without an active exception"): so the script
runs in a child process, on CPU and on tpu, and both must print the same. Slow: the child
starts torch, jax and the PJRT client (about 6 s of CPU); the native hooks' fast tests are in
tests/test_pinned_memory.py.
"""
import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import json, sys, torch

    def run(device):
        seen = {}
        x = torch.randn(3, device=device, requires_grad=True)
        h = x * 2
        def fail(grad):
            raise ValueError("hook failed")
        h.register_hook(fail)                     # an intermediate's gradient hook
        try:
            (h * h).sum().backward()
        except Exception as err:
            seen["intermediate"] = [type(err).__name__, str(err)]
        w = torch.nn.Linear(3, 2).to(device)
        w.weight.register_hook(lambda grad: 1 / 0)  # a leaf's
        try:
            w(torch.ones(4, 3, device=device)).sum().backward()
        except Exception as err:
            seen["leaf"] = [type(err).__name__, str(err)]
        calls = []
        def recomputed(t):                        # activation checkpointing's recomputation
            calls.append(1)
            if len(calls) > 1:
                raise KeyError("recomputation failed")
            return (t * 2).sin()
        from torch.utils.checkpoint import checkpoint
        z = torch.randn(3, device=device, requires_grad=True)
        try:
            checkpoint(recomputed, z, use_reentrant=False).sum().backward()
        except Exception as err:
            seen["recomputation"] = [type(err).__name__, str(err)]
        # The engine is still usable after all three.
        y = torch.ones(2, device=device, requires_grad=True)
        (y * 3).sum().backward()
        seen["after"] = y.grad.cpu().tolist()
        return seen

    print(json.dumps({device: run(device) for device in ("cpu", "tpu")}))
""")


def test_exception_in_a_hook_during_a_tpu_backward_raises_as_on_cpu():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["tpu"] == results["cpu"]
    assert results["cpu"]["intermediate"] == ["ValueError", "hook failed"]
    assert results["cpu"]["leaf"][0] == "ZeroDivisionError"
    assert results["cpu"]["recomputation"][0] == "KeyError"
