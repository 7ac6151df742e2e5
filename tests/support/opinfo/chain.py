"""Chains: many OpInfo samples run back to back on the tpu device with no materialization point
between them, results fed into later samples, and everything compared with the same sequence
in eager CPU PyTorch at the end: ``check_chain(name, path, dtype, length)``.

The per-sample sweep (``harness.check``) runs each sample on its own, so a defer-and-fuse
recording holds one op. A chain records many, wired together:

- a sample's first input replaced by an earlier result (or its input, or a view of either:
  a row, ``mT``, a reshape, ``unsqueeze(0).squeeze(0)``) of the same shape and dtype;
- the op's in-place variant run on such a view of an earlier tensor, and ``out=`` an earlier
  tensor of the result's shape and dtype;
- in ``mix`` and ``grad`` chains (a random mix of entries under a seed) also: views made and
  kept, in-place writes into them (``add_``, ``fill_``, ``copy_``, ...), a read back in the
  middle (``.cpu()``, ``.item()``, ``print``), ``torch.tpu.synchronize()`` (a cut, on the
  device), ``torch.no_grad`` / ``torch.inference_mode`` entered and left; in ``grad`` chains
  the first samples' float inputs require grad and a backward of every result runs at the end.
  In ``fuse`` mix chains with an odd seed the recording is also cut every 3 ops
  (``fuse_max_ops``), so views outlive cuts.

Every decision is made on the eager CPU run (the reference; it may look at values: only finite,
moderate tensors are fed) and replayed on the device. A step eager CPU rejects is dropped and
the chain re-recorded without it. Compared at the end: every tensor a step made or took (so
every input written in place), every host value, every read in the middle, every gradient.

Names: an OpInfo entry ("add", "max.reduction_with_dim": a chain of that entry's samples),
``mix.SEED`` or ``grad.SEED``. Repro with the steps listed::

    python -m tests.support.opinfo.chain mix.7 --path fuse --dtype fp32 --length 24
"""
from __future__ import annotations

import contextlib
import io
import random
import time
import traceback

import torch
from torch.utils._pytree import tree_flatten, tree_map

from . import paths
from .harness import (_WIDER, DTYPE_NAMES, Result, _compare, _one_line, _sample_call, _samples,
                      entry_name, skipped)

#: The paths a chain runs on: the tpu device in strict and in defer-and-fuse mode.
CHAIN_PATHS = ("eager", "fuse")
MODES = {"eager": "strict", "fuse": "defer_and_fuse"}
#: Largest magnitude of a tensor fed into a later step: chained exp/pow would otherwise turn
#: rounding differences into infinities on one side only.
TAME = 1e3


class _Dropped(Exception):
    """A step eager CPU rejected (the recording run drops it and starts again)."""

    def __init__(self, step: int, exc: BaseException):
        super().__init__(f"step {step}: {type(exc).__name__}: {exc}")
        self.step = step


class _Plan:
    """The decisions of a chain: drawn on the CPU run, replayed on the device."""

    def __init__(self, seed: int, dropped: set):
        self.rng = random.Random(seed)
        self.log: list = []
        self.recording = True
        self.position = 0
        self.dropped = dropped
        self.trace: list = []   # what each step did, for the failure message

    def decide(self, draw):
        """``draw()`` (with ``self.rng``) on the CPU run; its recorded value on the device."""
        if self.recording:
            value = draw()
            self.log.append(value)
            return value
        value = self.log[self.position]
        self.position += 1
        return value

    def replay(self) -> _Plan:
        self.recording, self.position, self.trace = False, 0, []
        return self


def _tame(t: torch.Tensor) -> bool:
    if t.numel() == 0 or t.dtype is torch.bool:
        return True
    if t.is_floating_point() or t.is_complex():
        return bool(t.isfinite().all()) and float(t.abs().max()) <= TAME
    return float(t.abs().max()) <= 1e6


def _view(t: torch.Tensor, form):
    """The view ``form`` names of ``t`` (forms: see ``_views``)."""
    kind = form[0]
    if kind == "same":
        return t
    if kind == "squeeze":     # a view of a view
        return t.unsqueeze(0).squeeze(0)
    if kind == "mT":
        return t.mT
    if kind == "row":
        return t[form[1]]
    if kind == "reshape":
        return t.view(form[1])
    if kind == "narrow":
        return t.narrow(0, form[1], 1)
    if kind == "diagonal":
        return t.diagonal()
    raise ValueError(f"unknown view form {form!r}")


def _views(t: torch.Tensor, shape=None) -> list:
    """View forms of ``t`` (of ``shape``, when given)."""
    forms = [("same",), ("squeeze",)]
    if t.dim() >= 2:
        forms += [("mT",), ("diagonal",)]
    if t.dim() >= 1 and t.shape[0] > 0:
        forms += [("row", t.shape[0] - 1), ("narrow", 0)]
    if shape is not None and t.is_contiguous() and t.numel() == _numel(shape):
        forms.append(("reshape", tuple(shape)))
    if shape is None:
        return forms
    return [f for f in forms if tuple(_view(t, f).shape) == tuple(shape)]


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


class _Chain:
    """One run of a chain's steps on one side (CPU, or the tpu device in a mode)."""

    def __init__(self, plan: _Plan, device: str, sync=None, widen=None):
        self.plan, self.device, self.sync, self.widen = plan, device, sync, widen
        self.pool: list = []     # every tensor a step made or took, in order
        self.groups: list = []   # CPU run: the storage group of each pool tensor
        self.values: list = []   # host values: non-tensor results, reads in the middle
        self.leaves: list = []   # tensors that require grad (grad chains)
        self.modes = contextlib.ExitStack()
        self.mode_stack: list = []

    # -- the pool -------------------------------------------------------------------------
    def add(self, t: torch.Tensor, group=None) -> None:
        self.pool.append(t)
        if self.plan.recording:
            self.groups.append(group if group is not None else _storage(t))

    def _candidates(self, shape, dtype, avoid=(), writable=False) -> list:
        out = []
        for i, t in enumerate(self.pool):
            if t.dtype != dtype or self.groups[i] in avoid or not _tame(t):
                continue
            if writable and (t.requires_grad and t.is_leaf):
                continue
            out += [(i, f) for f in _views(t, shape)]
        return out

    def pick_view(self, shape, dtype, p: float, avoid=(), writable=False):
        """(pool index, view form) of an earlier tensor of ``shape`` and ``dtype``, or None;
        a recent one more often."""
        def draw():
            if self.plan.rng.random() >= p:
                return None
            found = self._candidates(shape, dtype, avoid, writable)
            if not found:
                return None
            recent = [c for c in found if c[0] >= found[-1][0] - 3]
            return self.plan.rng.choice(recent if self.plan.rng.random() < 0.6 else found)
        return self.plan.decide(draw)

    # -- steps ----------------------------------------------------------------------------
    def to_side(self, value):
        """A sample's (args, kwargs) on this side: tensors moved, and a factory's
        ``device="cpu"`` (OpInfo's samples name it) made this side's device."""
        if self.widen is not None:  # the wider reference: dtype's tensors and dtype args
            wide = _WIDER[self.widen]
            return tree_map(lambda v: v.to(wide) if isinstance(v, torch.Tensor) and
                            v.dtype is self.widen else wide if v is self.widen else v, value)
        if self.device == "cpu":
            return value
        args, kwargs = tree_map(paths._to(self.device), value, is_leaf=paths._is_leaf)
        if "device" in kwargs and torch.device(kwargs["device"]).type == "cpu":
            kwargs = {**kwargs, "device": self.device}
        return args, kwargs

    def sample_step(self, k: int, op, sample, grad: bool, allow_write: bool = True) -> None:
        plan = self.plan
        args, kwargs = self.to_side(_sample_call(sample))
        args = list(args)
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if grad and plan.decide(lambda: len(self.leaves) < 3):
            for t in tree_flatten((args, kwargs))[0]:
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    t.requires_grad_(True)
                    self.leaves.append(t)
        fed = None
        arg_groups = {_storage(t) for t in tree_flatten((args, kwargs))[0]
                      if isinstance(t, torch.Tensor)} if plan.recording else set()
        variants = ["fn"]
        if allow_write and first is not None and op.inplace_variant is not None:
            variants.append("inplace")
        if allow_write and op.supports_out and "out" not in kwargs:
            variants.append("out")
        variant = plan.decide(lambda: plan.rng.choice(variants)
                              if plan.rng.random() < 0.4 else "fn")
        if first is not None and not _unchecked(op):
            fed = self.pick_view(tuple(first.shape), first.dtype,
                                 1.0 if variant == "inplace" else 0.6,
                                 writable=variant == "inplace")
            if fed is not None:
                args[0] = _view(self.pool[fed[0]], fed[1])
                if plan.recording:
                    arg_groups.add(self.groups[fed[0]])
        if variant == "inplace" and fed is None:
            variant = "fn"
        out_target = None
        if variant == "out":
            out_target = plan.decide(lambda: self._out_target(op, args, kwargs, arg_groups))
            if out_target is None:
                variant = "fn"
        plan.trace.append(f"step {k}: {entry_name(op)}[{variant}]"
                          + (f" input <- pool {fed[0]} {fed[1]}" if fed else "")
                          + (f" out= pool {out_target[0]} {out_target[1]}" if out_target
                             else ""))
        torch.manual_seed(k)  # random ops draw the same numbers on both sides
        if variant == "inplace":
            result = op.inplace_variant(*args, **kwargs)
        elif variant == "out":
            target = _view(self.pool[out_target[0]], out_target[1])
            result = op.op(*args, **kwargs, out=target)
        else:
            result = op.op(*args, **kwargs)
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor):
                self.add(t)
        self.take(result)

    def _out_target(self, op, args, kwargs, avoid):
        """(pool index, form) for ``out=``: the result's shape and dtype, sharing no storage
        with the inputs; from a dry run on copies (CPU run only)."""
        if self.plan.rng.random() < 0.3:
            return None
        dry = op.op(*tree_map(_copy, args), **tree_map(_copy, kwargs))
        if not isinstance(dry, torch.Tensor):
            return None
        found = self._candidates(tuple(dry.shape), dry.dtype, avoid, writable=True)
        return self.plan.rng.choice(found) if found else None

    def take(self, result) -> None:
        for leaf in tree_flatten(result)[0]:
            if isinstance(leaf, torch.Tensor):
                self.add(leaf)
            else:
                self.values.append(leaf)

    def generic_step(self, k: int, kind: str) -> None:
        """A step of mix and grad chains that is no OpInfo sample."""
        plan = self.plan
        rng = plan.rng
        if kind == "sync":
            plan.trace.append(f"step {k}: synchronize")
            if self.sync is not None:
                self.sync()
            return
        if kind == "enter":
            which = plan.decide(lambda: rng.choice(["no_grad", "inference_mode"]))
            plan.trace.append(f"step {k}: enter {which}")
            self.modes.enter_context(torch.no_grad() if which == "no_grad"
                                     else torch.inference_mode())
            self.mode_stack.append(which)
            return
        if kind == "exit":
            plan.trace.append(f"step {k}: exit {self.mode_stack[-1] if self.mode_stack else '-'}")
            if self.mode_stack:
                self.mode_stack.pop()
                # ExitStack has no pop: close all and re-enter the ones still open.
                self.modes.close()
                self.modes = contextlib.ExitStack()
                for which in self.mode_stack:
                    self.modes.enter_context(torch.no_grad() if which == "no_grad"
                                             else torch.inference_mode())
            return
        choice = plan.decide(lambda: self._pick_any(kind))
        if choice is None:
            plan.trace.append(f"step {k}: {kind} (nothing to take)")
            return
        index, form, extra = choice
        t = _view(self.pool[index], form)
        plan.trace.append(f"step {k}: {kind} pool {index} {form} {extra}")
        if kind == "view":
            self.add(t, self.groups[index] if plan.recording else None)
        elif kind == "read":
            if extra == "item":
                self.values.append(t.reshape(-1)[0].item())
            elif extra == "print":
                buffer = io.StringIO()
                print(t, file=buffer)
                self.values.append(t.cpu().clone())
            else:
                self.values.append(t.cpu().clone())
        elif kind == "poke":
            how, other = extra
            if how == "copy_":
                t.copy_(_view(self.pool[other[0]], other[1]))
            elif how == "fill_":
                t.fill_(3)
            elif how == "zero_":
                t.zero_()
            elif how == "add_":
                t.add_(1)
            else:
                t.mul_(2)

    def _pick_any(self, kind: str):
        rng = self.plan.rng
        if not self.pool:
            return None
        index = rng.randrange(len(self.pool))
        t = self.pool[index]
        forms = _views(t)
        if kind == "read":
            form = rng.choice(forms)
            extra = rng.choice(["cpu", "item", "print"])
            if extra == "item" and _view(t, form).numel() == 0:
                extra = "cpu"
            return index, form, extra
        if kind == "view":
            return index, rng.choice(forms[1:] or forms), None
        # poke: an in-place write into (a view of) an earlier tensor
        if t.requires_grad and t.is_leaf:
            return None
        form = rng.choice(forms)
        target = _view(t, form)
        how = rng.choice(["copy_", "fill_", "zero_", "add_", "mul_"])
        other = None
        if how == "copy_":
            found = self._candidates(tuple(target.shape), t.dtype, avoid={self.groups[index]})
            if not found:
                how = "fill_"
            else:
                other = rng.choice(found)
        if how in ("add_", "mul_") and t.dtype is torch.bool:
            how = "zero_"
        return index, form, (how, other)

    def backward(self) -> None:
        plan = self.plan
        chosen = plan.decide(lambda: [i for i, t in enumerate(self.pool)
                                      if t.requires_grad and t.is_floating_point()
                                      and t.grad_fn is not None and _tame(t.detach())])
        plan.trace.append(f"backward of pool {chosen}")
        if not chosen:
            return
        loss = sum(self.pool[i].float().sum() for i in chosen)
        loss.backward()


def _unchecked(op) -> bool:
    """The ``linalg.*_ex`` entries: on an input outside their domain (a non-positive-definite
    matrix for cholesky_ex) they report it in ``info`` and the rest is unspecified (LAPACK's
    partial factor, XLA's NaN): their samples are well-posed, a fed input need not be."""
    return entry_name(op).endswith("_ex")


def _copy(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr() if t.numel() else id(t)


def _chain_items(name: str, dtype, length: int, path: str) -> tuple:
    """The chain's steps: ("sample", op, sample) or a generic kind, and whether it is a grad
    chain."""
    if name.startswith(("mix.", "grad.")):
        kind, seed = name.split(".")
        grad = kind == "grad"
        rng = random.Random(int(seed))
        torch.manual_seed(int(seed))  # OpInfo draws its sample tensors from torch's generator
        ops = _eligible_ops(dtype, path, grad)
        items = []
        while len(items) < length:
            roll = rng.random()
            if roll < 0.65:
                op = rng.choice(ops)
                samples = _samples(op, dtype, 3)
                if samples:
                    items.append(("sample", op, rng.choice(samples)))
            else:  # grad chains switch no mode: the backward would see none of it
                items.append(rng.choice(["view", "view", "poke", "read", "sync"] if grad else
                                        ["view", "view", "poke", "poke", "read", "sync",
                                         "enter", "exit"]))
        return items, grad
    from torch.testing._internal.common_methods_invocations import op_db
    op = next(o for o in op_db if entry_name(o) == name)
    torch.manual_seed(0)
    samples = _samples(op, dtype, length)
    return [("sample", op, samples[i % len(samples)]) for i in range(length)] \
        if samples else [], False


_ELIGIBLE: dict = {}


def _eligible_ops(dtype, path: str, grad: bool) -> list:
    """OpInfo entries that support ``dtype`` on CPU and are not skipped on ``path``."""
    key = (dtype, path, grad)
    if key not in _ELIGIBLE:
        from torch.testing._internal.common_methods_invocations import op_db
        ops = []
        for op in op_db:
            if dtype not in op.supported_dtypes("cpu") or (grad and not op.supports_autograd):
                continue
            probe = Result(entry_name(op), path, DTYPE_NAMES[dtype], "pass")
            if not skipped(probe):
                ops.append(op)
        _ELIGIBLE[key] = ops
    return _ELIGIBLE[key]


def _play(items, plan: _Plan, grad: bool, device: str, sync=None, widen=None):
    chain = _Chain(plan, device, sync, widen)
    try:
        for k, item in enumerate(items):
            if k in plan.dropped:
                continue
            try:
                if isinstance(item, tuple):
                    chain.sample_step(k, item[1], item[2], grad)
                else:
                    chain.generic_step(k, item)
            except Exception as exc:
                if plan.recording:
                    raise _Dropped(k, exc) from exc
                raise AssertionError(f"{plan.trace[-1] if plan.trace else f'step {k}'}: "
                                     f"raised {type(exc).__name__} where eager returned: "
                                     f"{exc}") from exc
        if grad and len(items) not in plan.dropped:  # backward is step len(items)
            try:
                chain.backward()
            except Exception as exc:
                if plan.recording:
                    raise _Dropped(len(items), exc) from exc
                raise AssertionError(f"backward raised {type(exc).__name__} where eager "
                                     f"returned: {exc}") from exc
    finally:
        chain.modes.close()
    return chain


def record(items, seed: int, grad: bool, dropped_limit: int = 64) -> tuple:
    """The CPU run (the reference) and its plan, steps eager rejects dropped."""
    dropped: set = set()
    reasons = record.reasons = {}  # step -> why eager rejected it (for --verbose)
    while True:
        plan = _Plan(seed, dropped)
        try:
            return _play(items, plan, grad, "cpu"), plan
        except _Dropped as why:
            if len(dropped) >= dropped_limit or why.step in dropped:
                raise
            dropped.add(why.step)
            reasons[why.step] = str(why)


def _wider(items, plan: _Plan, grad: bool, dtype):
    """The chain replayed on the CPU in the next wider dtype (fp64 for fp32): a result nearer
    it than eager's passes, as in ``harness.check`` (chained solves amplify rounding); None
    where that run fails or the dtype has no wider one."""
    if dtype not in _WIDER:
        return None
    try:
        return _play(items, plan.replay(), grad, "cpu", widen=dtype)
    except Exception:
        return None


def check_chain(name: str, path: str, dtype: torch.dtype, length: int = 16,
                verbose: bool = False) -> Result:
    """Record chain ``name`` (see the module docstring) of ``length`` steps on ``path``'s mode
    and compare with eager CPU.

    Example::

        check_chain("mix.3", "fuse", torch.float32, length=20).status   # "pass"
    """
    import torchtpu_compile
    from torchtpu_compile import config

    from ..helpers import eager_mode
    result = Result(name, path, DTYPE_NAMES[dtype], "pass")
    start = time.perf_counter()
    single = not name.startswith(("mix.", "grad."))
    if single:
        from torch.testing._internal.common_methods_invocations import op_db
        op = next(o for o in op_db if entry_name(o) == name)
        if dtype not in op.supported_dtypes("cpu"):
            result.status, result.detail = "n/a", "dtype not supported by the op on CPU"
            return result
        if skipped(result):
            return result
    seed = int(name.split(".")[1]) if not single else 0
    plan = None
    try:
        items, grad = _chain_items(name, dtype, length, path)
        if not items:
            result.status, result.detail = "skip", "OpInfo yields no samples for this dtype"
            return result
        expected, plan = record(items, seed, grad)
        torchtpu_compile.reset_stats()
        cut = {"fuse_max_ops": 3} if path == "fuse" and not single and seed % 2 else {}
        with config.patch(**cut), paths._capture_fallbacks(), eager_mode(MODES[path]):
            actual = _play(items, plan.replay(), grad, "tpu", sync=torch.tpu.synchronize)
            got = [t.detach().cpu() for t in actual.pool]
            grads = [t.grad.cpu() if t.grad is not None else None for t in actual.leaves]
        wide = _wider(items, plan, grad, dtype)
        want = [t.detach() for t in expected.pool]
        for i, (a, e) in enumerate(zip(got, want)):
            _compare(a, e, dtype, wide.pool[i].detach() if wide else None, what=f"pool {i}")
        _compare(actual.values, expected.values, dtype, wide.values if wide else None,
                 what="host value")
        _compare(grads, [t.grad for t in expected.leaves], dtype,
                 [t.grad for t in wide.leaves] if wide else None, what="grad")
        result.samples = len(items) - len(plan.dropped)
        result.fallback_ops = dict.fromkeys(torchtpu_compile.stats()["fallback_ops"], "")
        result.detail = f"{len(plan.dropped)} steps eager rejects dropped" \
            if plan.dropped else ""
        if verbose:
            print("\n".join(plan.trace))
            print("dropped:", record.reasons)
    except Exception as exc:
        result.status = "fail"
        steps = " | ".join(plan.trace[-4:]) if plan is not None else ""
        result.detail = _one_line(exc, 400) + (f" [last steps: {steps}]" if steps else "")
        if verbose:
            print(traceback.format_exc())
            if plan is not None:
                print("\n".join(plan.trace))
    result.seconds = time.perf_counter() - start
    return result


def main(argv=None) -> int:
    import argparse

    from .harness import DTYPES_BY_NAME
    parser = argparse.ArgumentParser(description="run one chain, steps and traceback shown")
    parser.add_argument("name")
    parser.add_argument("--path", default="fuse", choices=CHAIN_PATHS)
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--length", type=int, default=16)
    args = parser.parse_args(argv)
    import torchtpu_compile
    torchtpu_compile.config.matmul_precision = "highest"
    r = check_chain(args.name, args.path, DTYPES_BY_NAME[args.dtype], args.length,
                    verbose=True)
    print(r.status, r.detail)
    return 0 if r.status != "fail" else 1


if __name__ == "__main__":
    raise SystemExit(main())
