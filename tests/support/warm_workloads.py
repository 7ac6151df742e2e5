"""User-code workloads run once cold and once warm, each in its own process over one compile
cache: a warm start (entries served by the executable, lowering, aot_autograd and Dynamo caches)
must give the cold start's results bit for bit, and both must match eager CPU.

Each workload is ``fn(compiled: bool) -> dict[str, Tensor]``, registered with ``@workload``;
``compiled=False`` is the eager CPU reference. ``cold_then_warm`` runs one in two processes.

Example::

    cold, warm = cold_then_warm("sgd_momentum_onecycle", tmp_path / "cache")
    assert all(torch.equal(cold["results"][k], warm["results"][k]) for k in cold["results"])
"""
from __future__ import annotations

import subprocess
import sys

import torch

from tests.support import python_env
from torchtpu_compile import config

WORKLOADS = {}


def workload(fn):
    """Register ``fn`` under its name (``python -m tests.support.warm_workloads NAME OUT``)."""
    WORKLOADS[fn.__name__] = fn
    return fn


def _maybe_compile(fn, compiled: bool):
    return torch.compile(fn, backend="torchtpu") if compiled else fn


def _train_with_scheduler(compiled, make_opt, make_sched, steps=6) -> dict:
    """A small MLP trained ``steps`` steps, forward and optimizer step compiled, the scheduler
    changing lr (and momentum or beta1) between steps: floats Dynamo passes as 0-d tensors."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    opt = make_opt(model.parameters())
    sched = make_sched(opt)
    forward = _maybe_compile(model, compiled)
    step = _maybe_compile(opt.step, compiled)
    losses = []
    with config.patch(matmul_precision="highest"):   # fp32 matmuls, as eager's
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(forward(x), y)
            loss.backward()
            step()
            sched.step()
            losses.append(loss.detach())
    return {"losses": torch.stack(losses),
            **{f"param{i}": p.detach().clone() for i, p in enumerate(model.parameters())}}


@workload
def sgd_momentum_onecycle(compiled: bool) -> dict:
    # OneCycleLR cycles SGD's momentum as well as lr
    return _train_with_scheduler(
        compiled, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=6))


@workload
def adam_onecycle(compiled: bool) -> dict:
    # OneCycleLR cycles Adam's beta1 (the warm bug of b3cac02)
    return _train_with_scheduler(
        compiled, lambda p: torch.optim.Adam(p, lr=1e-2),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.05, total_steps=6))


@workload
def nadam_cosine(compiled: bool) -> dict:
    return _train_with_scheduler(
        compiled, lambda p: torch.optim.NAdam(p, lr=1e-2),
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4))


@workload
def radam_cosine(compiled: bool) -> dict:
    # RAdam switches formula when its rectification term passes 5 (step 6 with beta2=0.999)
    return _train_with_scheduler(
        compiled, lambda p: torch.optim.RAdam(p, lr=1e-2),
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4), steps=8)


@workload
def nadam_onecycle(compiled: bool) -> dict:
    return _train_with_scheduler(
        compiled, lambda p: torch.optim.NAdam(p, lr=1e-2),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.05, total_steps=6))


@workload
def dropout_train_eval(compiled: bool) -> dict:
    """Dropout toggled by train()/eval(): each mode must run its own graph, warm as cold."""
    torch.manual_seed(0)
    linear, dropout = torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)
    model = torch.nn.Sequential(linear, dropout)
    x = torch.randn(16, 8)
    forward = _maybe_compile(model, compiled)
    out = {}
    with torch.no_grad(), config.patch(matmul_precision="highest"):
        for i, mode in enumerate(("eval", "train", "eval", "train")):
            getattr(model, mode)()
            torch.manual_seed(i)
            out[f"{i}_{mode}"] = forward(x)
    out["linear"] = linear(x).detach()
    return out


@workload
def device_random_draws(compiled: bool) -> dict:
    """Dropout and randn_like drawn inside the program (``random_draws="device"``, TPU's
    default), each call right after ``torch.manual_seed(3)``: the same numbers every time."""

    def draws(x):
        return torch.nn.functional.dropout(x, 0.3, True), torch.randn_like(x)
    forward = _maybe_compile(draws, compiled)
    x = torch.ones(1000)
    out = {}
    with config.patch(random_draws="device"):
        for call in ("first", "again"):
            torch.manual_seed(3)
            out[f"dropout_{call}"], out[f"normal_{call}"] = forward(x)
    return out


@workload
def remainder_of_literals(compiled: bool) -> dict:
    """A remainder of values the graph makes itself: lowered through our C-fmod op."""
    def f(x):
        return x + (torch.arange(10) - 7) % 5, torch.remainder(torch.arange(-4.5, 0), 2)
    ints, floats = _maybe_compile(f, compiled)(torch.zeros(10, dtype=torch.int64))
    return {"ints": ints, "floats": floats}


def _jax_function_graphs(x):
    """Ops our decompositions compute with JAX functions (kernels/jax_op), registered by name
    on first use: an FFT, complex arithmetic, a bit view across widths."""
    z = torch.polar(x[:4], x[4:])
    return torch.fft.rfft(x).abs().sum() + (z * z.conj()).real.sum() + \
        x.view(torch.uint8).float().sum() * 1e-3


def _linalg_with_error_checks(x):
    """linalg.cholesky: its _linalg_check_errors is an effectful op (an effect token)."""
    a = x[:4].reshape(2, 2)
    return torch.linalg.cholesky(a @ a.T + torch.eye(2, dtype=x.dtype)).sum()


@workload
def jax_function_ops(compiled: bool) -> dict:
    """``_jax_function_graphs`` and ``_linalg_with_error_checks`` with their gradients,
    compiled (``compiled``; else eager CPU), and the first on the eager tpu device."""
    out = {}
    for name, fn in (("jax", _jax_function_graphs), ("linalg", _linalg_with_error_checks)):
        x = torch.linspace(0.5, 2.0, 8, requires_grad=True)
        with config.patch(matmul_precision="highest"):
            y = _maybe_compile(fn, compiled)(x)
            y.backward()
        out[name], out[f"{name}_grad"] = y.detach(), x.grad
    x = torch.linspace(0.5, 2.0, 8)
    out["device"] = _jax_function_graphs(x.to("tpu") if compiled else x).cpu()
    return out


def _tiny_llama():
    from tests.support import zoo
    model, _ = zoo.llama()
    return model


@workload
def hf_llama_adamw_linear_warmup(compiled: bool) -> dict:
    """A tiny Llama trained 3 steps: AdamW under transformers' linear warmup schedule, the
    model compiled as Trainer's ``torch_compile`` does. The optimizer step stays eager: under
    torch.compile, any backend (``"eager"`` too, torch 2.13), Adam's step at lr=0.0, the
    warmup's first, turns parameters with a zero gradient into NaN."""
    from transformers import get_linear_schedule_with_warmup
    model = _tiny_llama()
    model.train()
    torch.manual_seed(1)
    ids = torch.randint(3, 100, (2, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=10)
    forward = _maybe_compile(model, compiled)
    losses = []
    with config.patch(matmul_precision="highest"):
        for _ in range(3):
            opt.zero_grad()
            loss = forward(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.detach())
    return {"losses": torch.stack(losses),
            **{name: p.detach().clone() for name, p in model.named_parameters()}}


@workload
def hf_llama_greedy_generate(compiled: bool) -> dict:
    """Greedy generate() with the dynamic KV cache, prompts of three lengths."""
    model = _tiny_llama()
    model.eval()
    torch.manual_seed(1)
    prompts = [torch.randint(3, 100, (1, n)) for n in (4, 5, 7)]
    if compiled:
        model.forward = torch.compile(model.forward, backend="torchtpu")
    with torch.no_grad(), config.patch(matmul_precision="highest"):
        return {f"prompt{len(ids[0])}": model.generate(ids, max_new_tokens=6, min_new_tokens=6,
                                                       do_sample=False)
                for ids in prompts}


@workload
def eager_device_ops(compiled: bool) -> dict:
    """Ops on the eager tpu device (``compiled``; else on the CPU) whose graphs are traced in
    ways of their own: an op, its floats lifted to an input once a second value is seen, a
    strided read folded into an op, a write through a view, a permuted result's layout, an op
    of two returns, one of a list of returns, an in-place one, an out= resized."""
    device = "tpu" if compiled else "cpu"
    torch.manual_seed(0)
    x, w = torch.randn(6, 8).to(device), torch.randn(5, 8).to(device)
    with config.patch(matmul_precision="highest"):
        linear = torch.nn.functional.linear(x, w)        # reads w.t()
    scaled = [x * 2.5, x * -0.0, x * 3.5]                 # the third: floats as an input
    y = x.clone()
    y[1:4, ::2] += 1.0                                    # a write through a strided view
    values, indices = torch.topk(x, 3, dim=1)
    parts = torch._foreach_add([x, w], 1.0)
    out = torch.empty(0, device=device)
    torch.softmax(x, -1, out=out)
    return {"linear": linear, **{f"scaled{i}": s for i, s in enumerate(scaled)}, "y": y,
            "relu_t": x.t().relu(), "values": values, "indices": indices,
            "part0": parts[0], "part1": parts[1], "softmax_out": out, "sum": y[:, 1::3].sum(0)}


def cache_counters() -> dict:
    """Every cache's totals (all levels), the compile count and the eager device's traces,
    from torchtpu's stats."""
    import torchtpu_compile
    stats = torchtpu_compile.stats()
    return {"caches": {name: dict(levels["all"]) for name, levels in stats["caches"].items()},
            "compiled": stats["graphs_compiled"], "eager_traces": stats.get("eager_traces", 0)}


def run_in_process(name: str, cache_dir) -> dict:
    """Run workload ``name`` compiled in a fresh interpreter over the cache in ``cache_dir``;
    returns ``{"results": {...}, "counters": cache_counters()}``."""
    out = f"{cache_dir}.{name}.result.pt"
    env = python_env(TORCHTPU_CACHE_DIR=str(cache_dir))
    for var in ("TORCHTPU_REMOTE_CACHE", "TORCHTPU_GRAPH_CACHE", "TORCHTPU_DYNAMO_CACHE"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-m", "tests.support.warm_workloads", name, out],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out)


def cold_then_warm(name: str, cache_dir) -> tuple[dict, dict]:
    """The workload run in two processes over one (initially empty) cache: (cold, warm)."""
    return run_in_process(name, cache_dir), run_in_process(name, cache_dir)


def check_cold_warm_eager(name: str, cache_dir) -> tuple[dict, dict]:
    """Assert the warm process was served from the cache, gave the cold one's results bit
    for bit, and that both match eager CPU (``WORKLOADS[name](compiled=False)``; results
    named ``*_train``, dropout's, are left to the caller); returns (cold, warm)."""
    cold, warm = cold_then_warm(name, cache_dir)
    assert cold["counters"]["compiled"] > 0
    served = warm["counters"]["caches"]
    assert served["executable"]["misses"] == 0, served
    assert served["executable"]["hits"] + served["dynamo"]["hits"] > 0, served
    expected = WORKLOADS[name](compiled=False)
    assert cold["results"].keys() == warm["results"].keys() == expected.keys()
    for key, want in expected.items():
        assert torch.equal(warm["results"][key], cold["results"][key]), (
            f"{name}: {key} differs between the cold and the warm process")
        if key.split("_")[-1] != "train":  # dropout's masks: checked by the caller
            torch.testing.assert_close(cold["results"][key], want, rtol=1e-4, atol=1e-5,
                                       msg=lambda m, k=key: f"{k}: {m}")
    return cold, warm


if __name__ == "__main__":
    results = {k: v.cpu() for k, v in WORKLOADS[sys.argv[1]](compiled=True).items()}
    torch.save({"results": results, "counters": cache_counters()},
               sys.argv[2])
