"""Where eager CPU has no kernel for a dtype, we raise its error: OpInfo samples of a few
entries at dtypes their CPU claims leave out (tests/support/opinfo/unsupported.py), on both
paths. The whole sweep is ``python -m tests.support.opinfo.sweep --unsupported-dtypes``
(docs/coverage.md).

The entries are the kinds the sweep found returning values: matmuls of bool (bmm, mm, matmul
as dot, baddbmm), activations and pools without integer kernels (hardswish, celu,
adaptive_avg_pool2d, avg_pool2d), a transposed convolution of int8, bilinear interpolation of
bool, a loss whose composite writes a float into an integer tensor (soft_margin_loss:
RuntimeError, not NotImplementedError), and kernels that refuse a kind of dtype in their own
words (maximum and hardtanh of complex, relu and argmax of bool).
"""
from __future__ import annotations

import pytest
import torch

from tests.support.opinfo.harness import DTYPES_BY_NAME, entry_name
from tests.support.opinfo.unsupported import check_unsupported, unsupported_dtypes

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

CASES = [("bmm", "b8"), ("mm", "b8"), ("matmul", "b8"), ("baddbmm", "b8"),
         ("nn.functional.hardswish", "u8"), ("nn.functional.celu", "i32"),
         ("nn.functional.adaptive_avg_pool2d", "i64"), ("nn.functional.avg_pool2d", "i16"),
         ("nn.functional.conv_transpose2d", "i8"), ("nn.functional.interpolate.bilinear", "b8"),
         ("nn.functional.soft_margin_loss", "i64"),
         # refusals in kernels' own words: maximum of complex, hardtanh of complex (clamp's;
         # it aborted the process in lowering), relu and argmax of bool
         ("maximum", "c64"), ("nn.functional.hardtanh", "c64"), ("nn.functional.relu", "b8"),
         ("argmax", "b8")]


def _op(name):
    from torch.testing._internal.common_methods_invocations import op_db
    return next(op for op in op_db if entry_name(op) == name)


@pytest.mark.parametrize("path", ["compile", "eager"])
@pytest.mark.parametrize("entry,dtype", CASES)
def test_unsupported_dtype_raises_as_eager(entry, dtype, path):
    op = _op(entry)
    assert dtype in unsupported_dtypes(op), f"OpInfo now claims {dtype} for {entry}"
    result = check_unsupported(op, path, DTYPES_BY_NAME[dtype])
    assert result.samples > 0, f"{entry} at {dtype}: nothing ran ({result.detail})"
    assert set(result.verdicts) <= {"pass", "dynamo"}, \
        f"{entry} at {dtype} on {path}: {result.verdicts}: {result.detail}"


def test_supported_dtypes_still_run():
    # The probe raises only for eager's refusal of a dtype: float16 and int8 matmuls have CPU
    # kernels in this torch, and large inputs are probed at rank-preserving shapes of ones.
    a, b = torch.randn(3, 70, 80), torch.randn(3, 80, 90)
    for dtype in (torch.float16, torch.int8, torch.float32):
        x, y = a.to(dtype), b.to(dtype)
        expected = torch.bmm(x, y)
        compiled = torch.compile(torch.bmm, backend="torchtpu")(x, y)
        on_device = torch.bmm(x.to("tpu"), y.to("tpu")).cpu()
        for got in (compiled, on_device):
            torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-1)


def test_large_bool_inputs_are_refused_too():
    # Above the size probed exactly, the probe's zeros keep the rank with small dims.
    a = torch.ones(4, 100, 100, dtype=torch.bool)
    for run in (torch.compile(torch.bmm, backend="torchtpu"),
                lambda x, y: torch.bmm(x.to("tpu"), y.to("tpu")).cpu()):
        with pytest.raises(NotImplementedError, match="\"bmm\" not implemented for 'Bool'"):
            run(a, a)


@pytest.mark.parametrize("reduce", [torch.var, torch.std, torch.var_mean],
                         ids=["var", "std", "var_mean"])
def test_the_probe_of_a_large_reduction_warns_nothing(reduce, monkeypatch):
    # Its probe ran on one element, and the CPU kernel's "degrees of freedom is <= 0" warning
    # reached the user at the first var of every large tpu tensor (eager warns nothing).
    import warnings

    from torchtpu_compile import dtype_support
    monkeypatch.setattr(dtype_support, "_verdicts", {})
    x = torch.randn(5000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        expected = reduce(x)
        got = reduce(x.to("tpu"))
    torch.testing.assert_close(torch.utils._pytree.tree_map(lambda t: t.cpu(), got), expected)


def test_a_wrong_size_out_warns_once_as_eager(monkeypatch):
    # The probe's meta call (PyTorch's reference, with a literal "{str(shape)}" in its text)
    # and its host call (a C++ warning raised at the user's line) warned besides ours.
    import warnings

    from torchtpu_compile import dtype_support
    monkeypatch.setattr(dtype_support, "_verdicts", {})
    x = torch.randn(4)
    counts = []
    for device in ("cpu", "tpu"):
        out = torch.empty(3, device=device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.add(x.to(device), 1, out=out)
        counts.append(sum("was resized" in str(w.message) for w in caught))
        torch.testing.assert_close(out.cpu(), x + 1)
    assert counts == [1, 1]


def test_probe_once_per_signature_and_rng_untouched(monkeypatch):
    from torchtpu_compile import dtype_support
    probes = []
    real = dtype_support._probe
    monkeypatch.setattr(dtype_support, "_probe", lambda fn, sig, *rest: probes.append(fn) or
                        real(fn, sig, *rest))
    monkeypatch.setattr(dtype_support, "_verdicts", {})
    state = torch.get_rng_state()
    x = torch.ones(8)
    dtype_support.check(torch.nn.functional.dropout, (x,), {"p": 0.5})
    assert torch.equal(torch.get_rng_state(), state)  # a probe of dropout drew nothing
    compiled = torch.compile(lambda a, b: torch.bmm(a, b) + 1, backend="torchtpu")
    a = torch.ones(2, 3, 3)
    compiled(a, a)
    first = len(probes)
    assert torch.bmm in probes
    compiled(a, a)
    torch._dynamo.reset()
    torch.compile(lambda a, b: torch.bmm(a, b) + 1, backend="torchtpu")(a, a)
    assert len(probes) == first  # no probe per call, and none again per signature


def test_histc_of_integers_runs_off_the_cpu_as_cuda_does():
    # transformers' MoE layers count tokens per expert with histc of int32 on any device but
    # the CPU (whose kernel refuses integers): Mixtral on the tpu device raised the CPU's
    # refusal. CUDA counts them, in the input's dtype; CPU tensors still raise.
    from tests.support.helpers import compile_tpu
    experts = torch.tensor([[0, 3], [1, 3], [3, 2], [5, -1]], dtype=torch.int32)
    expected = torch.histc(experts.float(), bins=4, min=0, max=3).to(torch.int32)
    counts = torch.histc(experts.to("tpu"), bins=4, min=0, max=3)
    assert counts.dtype == torch.int32 and torch.equal(counts.cpu(), expected)
    count = compile_tpu(lambda e: torch.histc(e, bins=4, min=0, max=3))
    assert torch.equal(count(experts.to("tpu")).cpu(), expected)
    with pytest.raises(NotImplementedError, match="not implemented for 'Int'"):
        torch.histc(experts, bins=4, min=0, max=3)


_CTC_ON_THE_DEVICE = """
import torch, torchtpu_eager
g = torch.Generator().manual_seed(0)
log_probs = torch.randn(50, 3, 15, generator=g).log_softmax(2)
targets = torch.randint(1, 15, (3, 30), generator=g)
lengths, target_lengths = [50] * 3, [30, 25, 20]
grads = []
for device in ("cpu", "tpu"):
    x = log_probs.clone().to(device).requires_grad_()
    loss = torch.nn.functional.ctc_loss(x, targets.to(device), lengths, target_lengths)
    loss.backward()
    grads.append(x.grad.cpu())
torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-5)
print("equal")
"""


def test_ctc_loss_backward_of_large_inputs_on_the_device_matches_eager():
    # The dtype probe ran CTC's CPU kernels at shrunken shapes with the real lengths, which
    # they trust: the backward read past its tensors and killed the process (SIGSEGV). In a
    # child process, so that a crash fails this test and not the run.
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", _CTC_ON_THE_DEVICE], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0 and "equal" in done.stdout, (done.returncode, done.stderr[-2000:])


def test_a_complex128_op_on_the_device_logs_no_fake_tensor_traceback(caplog):
    # It runs on the host (documented, with a one-line warning); before that, fake tensor
    # logged the jax_op's TypeError with its traceback at ERROR: forty lines per new op.
    x = torch.arange(3.0)
    scale = torch.tensor(0.5 + 1j, dtype=torch.complex128)
    with caplog.at_level("ERROR", logger="torch._subclasses.fake_tensor"):
        got = (x.to("tpu") * scale).cpu()
    torch.testing.assert_close(got, x * scale)
    assert not [r for r in caplog.records if r.name == "torch._subclasses.fake_tensor"]
