"""JAX functions and Pallas kernels as PyTorch ops (``torchtpu_compile.jax_op``) on every path.

The reference is the same computation written with PyTorch ops, run eagerly on CPU.
"""
import jax
import jax.numpy as jnp
import pytest
import torch
from jax.experimental import pallas as pl

import torchtpu_compile
import torchtpu_compile.aot as aot
from tests.support.helpers import compile_tpu, eager_mode
from torchtpu_compile import config
from torchtpu_compile import jax_op
from torchtpu_compile.lower.cache import graph_key


@jax_op
def rms_norm(x, w):
    return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w


def rms_norm_ref(x, w):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


@jax_op
def sin_and_fft(x):  # two results, one through an op torch-mlir has no lowering for
    return jnp.sin(x), jnp.fft.fft(x).real


def _double_plus_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] * 2 + y_ref[...]


@jax_op
def double_plus(x, y):  # a Pallas kernel; interpret=True is plain StableHLO on any platform
    return pl.pallas_call(_double_plus_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=True)(x, y)


@jax_op
def scaled_by_rows_of(x, like):  # reads only ``like``'s shape: jax.jit drops unused inputs
    return x * like.shape[0]


def model(x, w):
    a, b = sin_and_fft(x.cos())
    return rms_norm(a + 1, w) * b


def model_ref(x, w):
    c = x.cos()
    return rms_norm_ref(c.sin() + 1, w) * torch.fft.fft(c).real


def _inputs():
    torch.manual_seed(0)
    return torch.randn(4, 8), torch.randn(8)


def _grads(fn, x, w):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = fn(x, w)
    out.sum().backward()
    return out.detach(), x.grad, w.grad


def test_host_tensors_run_through_jax():
    x, w = _inputs()
    torch.testing.assert_close(rms_norm(x, w), rms_norm_ref(x, w))
    for got, want in zip(_grads(model, x, w), _grads(model_ref, x, w)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.cold_cache  # graphs_compiled == 2: a warm cache compiles nothing
def test_compiled_forward_and_backward_splice_the_jax_stablehlo():
    x, w = _inputs()
    torchtpu_compile.reset_stats()
    with config.patch(matmul_precision="highest"):
        got = _grads(compile_tpu(model), x, w)
    for g, want in zip(got, _grads(model_ref, x, w)):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-5)
    stats = torchtpu_compile.stats()
    assert stats["fallback_ops"] == {} and stats["graphs_compiled"] == 2  # forward, backward


def test_an_input_the_function_only_reads_the_shape_of_is_spliced():
    # JAX lowers a function without the inputs it never reads unless told to keep them; the
    # splice passes every input (it failed with "incorrect number of operands for callee").
    x, like = torch.randn(3, 4), torch.randn(5)
    torchtpu_compile.reset_stats()
    with config.patch(strict=True):
        got = compile_tpu(lambda a, b: scaled_by_rows_of(a + 1, b) * 2)(x, like)
    torch.testing.assert_close(got, (x + 1) * 5 * 2)
    assert torchtpu_compile.stats()["fallback_ops"] == {}


def test_eager_device_runs_the_op_and_its_gradient_on_device():
    import torchtpu_eager  # noqa: F401  (registers "tpu")
    x, w = _inputs()
    torchtpu_compile.reset_stats()
    xt, wt = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
    out = model(xt, wt)
    out.sum().backward()
    assert out.device.type == "tpu" and xt.grad.device.type == "tpu"
    want = _grads(model_ref, x, w)
    for g, r in zip((out, xt.grad, wt.grad), want):
        torch.testing.assert_close(g.detach().cpu(), r, rtol=1e-5, atol=1e-5)
    stats = torchtpu_compile.stats()
    assert stats["eager_fallbacks"] == 0 and stats["fallback_ops"] == {}


def test_pallas_kernel_on_host_device_and_compiled():
    import torchtpu_eager  # noqa: F401
    x, y = _inputs()[0], torch.randn(4, 8)
    torch.testing.assert_close(double_plus(x, y), 2 * x + y)
    torch.testing.assert_close(double_plus(x.to("tpu"), y.to("tpu")).cpu(), 2 * x + y)
    compiled = compile_tpu(lambda a, b: double_plus(a.sin(), b) - 1)
    torch.testing.assert_close(compiled(x, y), 2 * x.sin() + y - 1)


def test_integer_inputs_keep_64_bits():
    @jax_op
    def add_large(a):
        return a + 2 ** 40

    a = torch.tensor([1, 2 ** 41], dtype=torch.int64)
    assert torch.equal(compile_tpu(add_large)(a), a + 2 ** 40)
    assert torch.equal(add_large(a), a + 2 ** 40)


def test_aot_artifact_holds_the_jax_stablehlo(tmp_path):
    x, w = _inputs()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(w.clone())

        def forward(self, x):
            return model(x, self.w)

    with config.patch(matmul_precision="highest"):
        artifact = aot.compile(Block().eval(), (x,))
    artifact.save(tmp_path / "block.tpu")
    loaded = aot.load(tmp_path / "block.tpu")
    torch.testing.assert_close(loaded(x), model_ref(x, w), rtol=1e-5, atol=1e-5)


def test_dynamic_batch_compiles_the_exact_shape():
    # A jax function's reductions cannot be masked for padding, so it is never padded.
    x, w = _inputs()
    compiled = compile_tpu(lambda a, b: rms_norm(a, b) * 2, dynamic=True)
    for rows in (3, 5, 6):
        xs = torch.randn(rows, 8)
        torch.testing.assert_close(compiled(xs, w), rms_norm_ref(xs, w) * 2)


@jax_op
def matmul_as_the_mxu(x, w):
    # What a TPU's matrix unit multiplies at the precision JAX lowers this under: bf16-rounded
    # operands at "default" (torchtpu's "medium"), f32 ones at "highest". XLA's CPU compiler
    # ignores precision_config, so the kernel spells the rounding out.
    if jax.config.jax_default_matmul_precision in (None, "default", "bfloat16", "fastest"):
        x, w = x.astype(jnp.bfloat16).astype(jnp.float32), w.astype(jnp.bfloat16).astype(
            jnp.float32)
    return jnp.dot(x, w, preferred_element_type=jnp.float32)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_eager_program_of_a_jax_op_follows_a_precision_change(mode):
    # The eager device kept a program holding a jax_op call at the first precision it saw
    # (its list of precision-dependent ops knew only ATen's): run at "highest", then at
    # "medium", it kept computing f32 products.
    torch.manual_seed(0)
    x, w = torch.randn(8, 64), torch.randn(64, 8)
    f32 = x @ w
    bf16_operands = x.bfloat16().float() @ w.bfloat16().float()
    assert (f32 - bf16_operands).abs().max() > 1e-2  # the two precisions are told apart
    with eager_mode(mode):
        xt, wt = x.to("tpu"), w.to("tpu")
        for wanted, reference in (("highest", f32), ("medium", bf16_operands),
                                  ("highest", f32)):
            with config.patch(matmul_precision=wanted):
                got = matmul_as_the_mxu(xt, wt).cpu()
            torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5,
                                       msg=lambda m, wanted=wanted: f"at {wanted}: {m}")


def test_lowering_cache_key_follows_the_function_behind_the_name():
    from torch.fx.experimental.proxy_tensor import make_fx

    @jax_op(name="edited_in_place")
    def before(a):
        return a * 2

    gm = make_fx(lambda a: before(a), tracing_mode="fake")(torch.randn(3))
    old = graph_key(gm, "cpu", "highest")
    before.fn = lambda a: a * 3      # what a second process with an edited source would see
    before._lowered.clear()
    assert graph_key(gm, "cpu", "highest") != old


def test_misuse_is_a_clear_error():
    with pytest.raises(TypeError, match="argument 1 is a float"):
        rms_norm(torch.randn(2, 8), 1.0)
    with pytest.raises(ValueError, match="already registered"):
        jax_op(lambda x: x, name="rms_norm")
    with pytest.raises(ValueError, match="not a valid op name"):
        jax_op(lambda x: x)
