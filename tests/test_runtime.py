"""The one PJRT client, zero-copy transfers, resident weights, the cache and precision."""
import os
import subprocess
import sys

import pytest
import torch

import torchtpu_compile
from tests.support.helpers import PATHS, compile_tpu, run_on_path
from torchtpu_compile import config
from torchtpu_compile.errors import PlatformError
from torchtpu_compile.runtime import client as client_module
from torchtpu_compile.runtime.transfer import to_buffer, to_torch


def test_default_platform_is_cpu_here():
    assert client_module.get_client().platform == "cpu"


def test_invalid_platform_lists_the_platforms():
    with pytest.raises(PlatformError) as info:
        client_module._make_client("tpuu")
    message = str(info.value)
    assert "'tpuu'" in message
    for name in ("tpu", "cuda", "cpu"):
        assert name in message


def test_invalid_platform_from_the_environment():
    env = dict(os.environ, TORCHTPU_PLATFORM="gpu0")
    code = ("import torch\n"
            "torch.compile(lambda x: x + 1, backend='torchtpu')(torch.ones(2))\n")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode != 0
    assert "TORCHTPU_PLATFORM='gpu0'" in result.stderr and "tpu, cuda, cpu" in result.stderr


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64,
                                   torch.int32, torch.bool, torch.float64, torch.uint64,
                                   torch.float8_e4m3fn, torch.complex64])
def test_transfers_are_zero_copy_and_keep_dtype(dtype):
    t = torch.arange(6).to(dtype)
    if dtype in (torch.int64, torch.uint64, torch.float64):
        t[0] = 2 ** 40 + 1  # beyond 32 bits: a canonicalizing upload would lose it
    buf = to_buffer(t)
    assert buf.unsafe_buffer_pointer() == t.data_ptr()
    back = to_torch(buf)
    assert back.dtype == dtype and back.data_ptr() == t.data_ptr()
    assert torch.equal(back.view(torch.uint8), t.view(torch.uint8))


def test_conjugated_and_offset_tensors_upload_their_values():
    z = torch.randn(5, dtype=torch.complex64).conj()  # a lazy conjugate view
    assert torch.equal(to_torch(to_buffer(z)), z.resolve_conj())
    tail = torch.arange(10.0)[3:]  # contiguous, but not at the start of its storage
    assert torch.equal(to_torch(to_buffer(tail)), tail)


def test_a_calls_inputs_upload_as_to_buffer_would():
    """``to_buffers`` (every compiled call's inputs, one loop) gives each input's values, as
    ``to_buffer`` does, on its fast path and on every case it hands to the general one."""
    from torchtpu_compile.runtime.client import get_client
    from torchtpu_compile.runtime.transfer import to_buffers
    big = torch.tensor([2 ** 40 + 1, -3])          # int64 beyond 32 bits
    weight = torch.nn.Parameter(torch.randn(4, 3))
    inputs = [torch.randn(2, 3), torch.randn(3, 4).t(), torch.randn(5).to(torch.bfloat16),
              torch.randn(3, dtype=torch.complex64).conj(), torch.randn(3, requires_grad=True),
              big, torch.tensor(1.5), weight, torch.arange(10.0)[3:], torch.randn(4)]
    plan = [(i, False) for i in range(len(inputs))]
    plan[-1] = (len(inputs) - 1, True)              # resident by the program's say-so
    buffers, made, count = to_buffers(inputs, plan, get_client())
    for tensor, buffer in zip(inputs, buffers):
        expected = tensor.detach().resolve_conj()
        assert torch.equal(to_torch(buffer), expected), tensor
    # Counted as made for this call alone: the plain host tensors on the fast path (float32,
    # int64, the 0-dim one and the offset one); the others went through to_buffer, which
    # tracks its own.
    assert count == 4 and made == 6 * 4 + 2 * 8 + 4 + 7 * 4
    again, _, _ = to_buffers(inputs, plan, get_client())
    assert again[7] is buffers[7] and again[9] is buffers[9]   # resident: reused
    assert again[0] is not buffers[0]


def test_memory_peak_counts_a_compiled_calls_inputs():
    """Inputs uploaded for one call die with it, yet reach the peak while it runs."""
    import gc
    compiled = compile_tpu(lambda a, b: a.sum() + b.sum())
    a, b = torch.randn(256, 256), torch.randn(128, 256)
    compiled(a, b)
    gc.collect()
    torch.tpu.reset_peak_memory_stats()
    before = torch.tpu.memory_allocated()
    out = compiled(a, b)
    gc.collect()
    assert torch.tpu.max_memory_allocated() >= before + a.nbytes + b.nbytes
    assert torch.tpu.memory_allocated() == before + out.nbytes   # the result alone stays


def test_uploaded_inputs_are_freed_on_a_python_thread():
    """An input's memory is released on a thread that holds the GIL, never on a PJRT worker.

    torch frees a tensor that still has its Python object by taking the GIL, from a noexcept
    destructor: on a worker thread during interpreter exit that aborted the process
    ("terminate called without an active exception"). The tensors here are dropped while their
    program still runs, so a worker finishes with them last.
    """
    import threading
    import weakref

    def heavy(x):
        for _ in range(8):
            x = torch.tanh(x @ x)
        return x

    compiled = compile_tpu(heavy)
    freed_on, outs = [], []
    for _ in range(20):
        t = torch.randn(192, 192)
        weakref.finalize(t, lambda: freed_on.append(threading.get_ident()))
        outs.append(compiled(t))
        del t
    for out in outs:
        out.sum().item()
    del outs
    compiled(torch.randn(192, 192)).sum().item()  # jaxlib drops what it was holding
    assert freed_on and set(freed_on) == {threading.get_ident()}


def test_parameters_stay_resident_between_calls():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    compiled = compile_tpu(model)
    x = torch.randn(3, 8)
    with torch.no_grad():
        compiled(x)
        torchtpu_compile.reset_stats()
        for _ in range(5):
            compiled(x)
    assert torchtpu_compile.stats()["resident_uploads"] == 0
    with torch.no_grad():
        model[0].weight.add_(1)  # the device buffer is the weight's memory: no upload at all
        torch.testing.assert_close(compiled(x), model(x), rtol=2e-2, atol=2e-2)
        compiled(x)
    assert torchtpu_compile.stats()["resident_uploads"] == 0


def test_buffers_stay_resident_too():
    from torchtpu_compile.runtime import transfer
    bn = torch.nn.BatchNorm1d(4).eval()
    compiled = compile_tpu(bn)
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), bn(x))
        torchtpu_compile.reset_stats()
        compiled(x)
    assert torchtpu_compile.stats()["resident_uploads"] == 0
    for buffer in (bn.running_mean, bn.running_var):
        assert id(buffer) in transfer._resident


def test_identical_graph_is_not_recompiled():
    f = lambda x: (x.sin() * 3).sum(-1)
    compile_tpu(f)(torch.randn(4, 4))
    torchtpu_compile.reset_stats()
    compile_tpu(f)(torch.randn(4, 4))  # Dynamo traces again; XLA must not compile again
    stats = torchtpu_compile.stats()
    assert stats["graphs_compiled"] == 0 and stats["cache_hits"] == 1


def test_precision_is_part_of_the_cache_key():
    torch.manual_seed(0)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    f = compile_tpu(lambda x, y: x @ y)
    exact = a.double() @ b.double()
    with config.patch(matmul_precision="medium"):
        medium = f(a, b)
    with config.patch(matmul_precision="highest"):
        highest = f(a, b)
    torchtpu_compile.reset_stats()
    with config.patch(matmul_precision="medium"):
        again = f(a, b)
    assert torchtpu_compile.stats()["graphs_compiled"] == 0  # medium's program is kept
    assert torch.equal(again, medium)
    err_medium = (medium.double() - exact).abs().max().item()
    err_highest = (highest.double() - exact).abs().max().item()
    assert err_highest < 1e-4 < err_medium < 0.5  # bf16 operands: ~1e-2 on this problem


def test_medium_is_bf16_multiply_with_f32_accumulate():
    torch.manual_seed(0)
    a, b = torch.randn(128, 256), torch.randn(256, 32)
    with config.patch(matmul_precision="medium"):
        out = compile_tpu(lambda x, y: x @ y)(a, b)
    reference = a.bfloat16().double() @ b.bfloat16().double()  # exact products of bf16 values
    assert (out.double() - reference).abs().max().item() < 1e-4


_HALF_WIDTH_PROGRAMS = {
    "matmul": lambda a, b: torch.matmul(a, b).float(),
    "elementwise": lambda a, b: ((a * b + a) * 1.1).float(),
    "reduction": lambda a, b: (a + b).sum(0).float(),
}


@pytest.mark.parametrize("program", sorted(_HALF_WIDTH_PROGRAMS))
@pytest.mark.parametrize("path", PATHS)
def test_bf16_results_are_rounded_as_eager_rounds_them(path, program, tmp_path):
    # XLA's default excess precision kept bf16 intermediates in float32: a matmul's result
    # read with .float() was 0.06 off eager's on every path but the strict eager device
    # (fuzz seed 1654), so the device's modes disagreed with each other too.
    f = _HALF_WIDTH_PROGRAMS[program]
    torch.manual_seed(0)
    a, b = torch.randn(32, 32, dtype=torch.bfloat16), torch.randn(32, 32, dtype=torch.bfloat16)
    assert torch.equal(run_on_path(path, f, a, b, tmp_dir=tmp_path), f(a, b))


def test_excess_precision_on_is_xlas_float32_intermediates_and_another_program():
    f = _HALF_WIDTH_PROGRAMS["matmul"]
    torch.manual_seed(0)
    a, b = torch.randn(32, 32, dtype=torch.bfloat16), torch.randn(32, 32, dtype=torch.bfloat16)
    with config.patch(matmul_precision="highest"):
        rounded = compile_tpu(f)(a, b)
        torchtpu_compile.reset_stats()
        with config.patch(excess_precision="on"):
            kept = compile_tpu(f)(a, b)
        assert torchtpu_compile.stats()["graphs_compiled"] == 1  # not off's executable
    assert torch.equal(rounded, f(a, b))
    assert torch.equal(kept, (a.float() @ b.float()))  # the float32 result, never rounded


def test_precision_follows_torch_when_set_explicitly():
    from torchtpu_compile.lower.precision import resolve_precision
    saved = torch.get_float32_matmul_precision()
    try:
        assert resolve_precision() == "medium"  # nobody set anything: the TPU default
        torch.set_float32_matmul_precision("highest")
        assert resolve_precision() == "highest"
        torch.set_float32_matmul_precision("high")
        assert resolve_precision() == "high"
        with config.patch(matmul_precision="medium"):
            assert resolve_precision() == "medium"  # our config wins
    finally:
        torch.set_float32_matmul_precision(saved)
        # torch.testing._internal (the OpInfo tests) freezes these flags when imported.
        with getattr(torch.backends, "__allow_nonbracketed_mutation")():
            torch.backends.fp32_precision = "none"
            torch.backends.cuda.matmul.fp32_precision = "none"
            torch.backends.mkldnn.matmul.fp32_precision = "none"
    assert resolve_precision() == "medium"


def test_stats_report_the_promised_counters():
    compile_tpu(lambda x: x * 2)(torch.ones(3))
    stats = torchtpu_compile.stats()
    for key in ("graphs_compiled", "xla_compile_seconds", "cache_hits", "cache_misses",
                "fallback_ops"):
        assert key in stats


def test_backend_works_in_a_fresh_interpreter_without_importing_us():
    code = ("import sys, torch\n"
            "m = torch.nn.Linear(3, 2)\n"
            "x = torch.randn(4, 3)\n"
            "y = torch.compile(m, backend='torchtpu')(x)\n"
            "assert (y - m(x)).abs().max() < 5e-2\n"
            "print('loaded', 'torchtpu_compile' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "loaded True" in result.stdout


def test_importing_the_package_is_light():
    code = ("import sys, torchtpu_compile\n"
            "heavy = [m for m in ('jax', 'jaxlib', 'torch_mlir') if m in sys.modules]\n"
            "print(heavy)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_the_client_says_what_it_is():
    client = client_module.get_client()
    assert repr(client) == f"Client(platform={client.platform!r}, device={client.device})"


_DISPATCH_PROBE = """
import jax, jax.numpy as jnp
from torchtpu_compile.runtime.client import get_client
get_client()
f = jax.jit(lambda a: jnp.tanh(a @ a) @ a)
a = jnp.ones((1024, 1024))
f(a).block_until_ready()
ready = [f(a).is_ready() for _ in range(3)]
print(jax.config.values["jax_cpu_enable_async_dispatch"], all(ready))
"""


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_cpu_dispatch_sets_the_cpu_clients_mode_and_leaves_jaxs_flag(mode):
    # sync: a program has run when its call returns (its result is ready at once); async: a
    # 1024^3 matmul pair is still running on PJRT's pool. jax's own flag reads as before.
    env = dict(os.environ, TORCHTPU_CPU_DISPATCH=mode, TORCHTPU_PLATFORM="cpu")
    result = subprocess.run([sys.executable, "-c", _DISPATCH_PROBE], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    flag, ready = result.stdout.split()
    assert flag == "True"
    assert ready == ("True" if mode == "sync" else "False")


FORKED_CHILD = """
import os, signal, sys, torch
x = torch.ones(3, device="tpu")
(x + 1).cpu()
pid = os.fork()
if pid == 0:
    signal.alarm(60)  # a hang ends the child
    try:
        (x * 7).cpu()
        print("child returned", flush=True)
    except Exception as e:
        print("child raised", type(e).__name__, str(e), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("status", status, flush=True)
"""


def test_a_tpu_op_in_a_forked_child_raises_as_cuda_does():
    # PJRT's threads do not survive a fork: the child's compile hung for good (a DataLoader
    # worker moving its batch to the device). CUDA raises "Cannot re-initialize CUDA".
    done = subprocess.run([sys.executable, "-c", FORKED_CHILD], capture_output=True, text=True,
                          timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert "child raised PlatformError Cannot re-initialize tpu in forked subprocess" in \
        done.stdout, (done.stdout, done.stderr[-2000:])
    assert "status 0" in done.stdout
