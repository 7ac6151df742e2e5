"""The backward of tpu tensors runs on the thread that calls backward(), as for CPU tensors.

PyTorch's engine would run it on a device thread of its own (``autograd_thread.py``). The
reference for values is eager PyTorch on the CPU; for threads, the hooks' thread idents.
"""
import os
import subprocess
import sys
import threading

import torch

from torchtpu_compile import config


def _in_new_thread(fn):
    """fn's result, run on a thread of its own (each thread sets itself up at its first op)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # re-raised on the test's thread
            out["error"] = exc
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def _backward_threads():
    """(the calling thread, the threads the backward's hooks ran on, x's gradient on the host,
    the same gradient computed on the CPU)."""
    torch.manual_seed(0)
    w = torch.randn(3, 8)
    x_cpu = torch.randn(3, 8, requires_grad=True)
    x = x_cpu.detach().to("tpu").requires_grad_()
    seen = []
    x.register_hook(lambda g: seen.append(threading.get_ident()))
    (torch.tanh(x) * w.to("tpu")).sum().backward()
    (torch.tanh(x_cpu) * w).sum().backward()
    return threading.get_ident(), seen, x.grad.cpu(), x_cpu.grad


def test_backward_runs_on_the_calling_thread_with_cpu_values():
    me, seen, grad, expected = _in_new_thread(_backward_threads)
    assert seen == [me]
    torch.testing.assert_close(grad, expected)


def test_setting_off_leaves_pytorch_s_device_thread():
    with config.patch(backward_on_calling_thread=False):
        me, seen, grad, expected = _in_new_thread(_backward_threads)
    assert len(seen) == 1 and seen[0] != me
    torch.testing.assert_close(grad, expected)


def test_a_thread_without_tpu_ops_keeps_pytorch_s_default():
    def cpu_only():
        x = torch.randn(3, requires_grad=True)
        (x * 2).sum().backward()
        return torch._C._is_multithreading_enabled()
    assert _in_new_thread(cpu_only) is True


def test_a_choice_made_after_the_first_op_is_kept():
    def later_choice():
        torch.ones(2, device="tpu").add_(1)           # the thread's first op
        with torch.autograd.set_multithreading_enabled(True):
            return _backward_threads()
    me, seen, _, _ = _in_new_thread(later_choice)
    assert len(seen) == 1 and seen[0] != me


THREADS_TRACING = """
import threading, torch, torchtpu_compile
torch.set_float32_matmul_precision("highest")
errors = []
def work(i):
    try:
        torch.manual_seed(i)
        w_cpu, x_cpu = torch.randn(4 + i, 4 + i), torch.randn(2, 4 + i)
        w, x = w_cpu.to("tpu").requires_grad_(), x_cpu.to("tpu")
        w_cpu.requires_grad_()
        for k in range(3):
            ((x @ w).tanh().softmax(-1) * (k + 1)).log().sum().backward()
            ((x_cpu @ w_cpu).tanh().softmax(-1) * (k + 1)).log().sum().backward()
        torch.testing.assert_close(w.grad.cpu(), w_cpu.grad, rtol=1e-4, atol=1e-5)
    except Exception as e:
        errors.append(f"thread {i}: {type(e).__name__}: {e}")
threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
[t.start() for t in threads]; [t.join() for t in threads]
print(errors, torchtpu_compile.stats()["fallback_ops"])
"""


def test_threads_tracing_new_ops_at_once_get_eagers_values(tmp_path):
    # With a cold cache, threads traced their ops at once: make_fx patches process globals,
    # and a trace failed ("CURRENT_PATCHER is None in finally block") or ran on the host.
    done = subprocess.run([sys.executable, "-c", THREADS_TRACING], capture_output=True,
                          text=True, timeout=600, cwd=os.path.dirname(os.path.dirname(__file__)),
                          env={**os.environ, "TORCHTPU_CACHE_DIR": str(tmp_path),
                               "TORCHTPU_STRICT": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[] {}", done.stdout[-3000:]
