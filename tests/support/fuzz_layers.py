"""The templates of the fuzzer's training programs (``fuzz.TRAINING``, ``--generation 4``):
``nn.functional`` layers whose parameters are new inputs that require grad (in the odd layouts
of ``fuzz._layout``), fed by the program's earlier values or by new inputs, and the glue
between them (views, pointwise ops, reductions, in-place ops on intermediate values).

Ops whose gradient is not defined at some points (max and its kin among equal values) take
inputs without ties: new inputs hold distinct values, and an earlier value is used only where
its values are distinct. Kinks that eager defines (relu at 0, abs at 0) stay: eager's answer
is the answer.

Example::

    python -m tests.support.fuzz --generation 4 --seeds 6000:6050 --paths compile,eager,fuse
"""
from __future__ import annotations

import math

import torch

from .fuzz import TRAINING, pick

F = "torch.nn.functional"

#: name -> (weight, function(rng, env, param) -> a right-hand side or None, generation).
LAYERS: dict = {}


def layer(weight: float = 1.0, generation: int = TRAINING):
    """Register a training template: ``fn(rng, env, param)`` returns source over the names in
    ``env`` and the new inputs ``param(shape, grad=True, positive=False, distinct=False)`` adds
    (each returns its name), or None.

    Example::

        @layer(2)
        def linear(rng, env, param):
            return f"torch.nn.functional.linear({param((2, 3))}, {param((4, 3))})"
    """
    def register(fn):
        LAYERS[fn.__name__] = (weight, fn, generation)
        return fn
    return register


def _always(t):
    return True


def _distinct(t) -> bool:
    """Whether ``t``'s values are all different (NaNs count as equal)."""
    flat = t.detach().flatten().nan_to_num(12345.0)
    return flat.unique().numel() == flat.numel()


def _act(rng, env, param, sizes, ok=_always) -> tuple:
    """(name, shape) of an activation of ``len(sizes)`` dims: an earlier value of the program
    that requires grad (most of the time, where one fits ``ok``), or a new input whose dim i
    is in the range ``sizes[i]``."""
    if rng.random() < 0.6:
        name = pick(rng, env, lambda t: t.is_floating_point() and t.requires_grad and
                    t.dim() == len(sizes) and t.numel() > 0 and ok(t))
        if name is not None:
            return name, tuple(env[name].shape)
    shape = tuple(rng.randint(lo, hi) for lo, hi in sizes)
    return param(shape, distinct=ok is _distinct), shape


def _any_act(rng, env, param, ok=_always) -> tuple:
    rank = rng.choice((1, 2, 2, 3, 4))
    return _act(rng, env, param, [(1, 4)] * rank, ok)


def _maybe(rng, param, shape, p=0.6, **kw) -> str:
    return param(shape, **kw) if rng.random() < p else "None"


@layer(3)
def linear(rng, env, param):
    """linear (a weight of any layout, bias or not) and bilinear."""
    x, shape = _act(rng, env, param, [(1, 3)] * rng.choice((1, 2, 3)))
    out = rng.randint(1, 4)
    if rng.random() < 0.25 and len(shape) == 2:
        other = rng.randint(1, 3)
        y, w = param((shape[0], other)), param((out, shape[-1], other))
        return f"{F}.bilinear({x}, {y}, {w}, {_maybe(rng, param, (out,))})"
    return f"{F}.linear({x}, {param((out, shape[-1]))}, {_maybe(rng, param, (out,))})"


def _spatial(rng, env, param, nd, ok=_always, lo=3):
    return _act(rng, env, param, [(1, 2), (1, 4)] + [(lo, 7)] * nd, ok)


@layer(4)
def conv(rng, env, param):
    """conv1d/conv2d: stride, padding (numbers, 'same', 'valid'), dilation, groups."""
    nd = rng.choice((1, 2))
    x, shape = _spatial(rng, env, param, nd)
    c = shape[1]
    groups = rng.choice([g for g in (1, 2, 3, 4) if c % g == 0])
    out = groups * rng.randint(1, 2)
    k = tuple(rng.randint(1, 3) for _ in range(nd))
    w, b = param((out, c // groups) + k), _maybe(rng, param, (out,))
    padding = rng.choice((0, 1, 2, "'same'", "'valid'", tuple(rng.randint(0, 1) for _ in k)))
    stride = 1 if padding == "'same'" else rng.choice((1, 2, (2, 1)[:nd]))
    dilation = rng.choice((1, 2))
    return (f"{F}.conv{nd}d({x}, {w}, {b}, stride={stride}, padding={padding}, "
            f"dilation={dilation}, groups={groups})")


@layer(3)
def conv_transpose(rng, env, param):
    """conv_transpose1d/2d: stride, padding, output_padding, groups, dilation."""
    nd = rng.choice((1, 2))
    x, shape = _spatial(rng, env, param, nd, lo=2)
    c = shape[1]
    groups = rng.choice([g for g in (1, 2, 3, 4) if c % g == 0])
    per_group = rng.randint(1, 2)
    k = tuple(rng.randint(1, 3) for _ in range(nd))
    w, b = param((c, per_group) + k), _maybe(rng, param, (per_group * groups,))
    stride, dilation = rng.choice((1, 2, 3)), rng.choice((1, 2))
    output_padding = rng.randint(0, max(stride, dilation) - 1)
    padding = rng.randint(0, 2)
    return (f"{F}.conv_transpose{nd}d({x}, {w}, {b}, stride={stride}, padding={padding}, "
            f"output_padding={output_padding}, groups={groups}, dilation={dilation})")


@layer(4)
def pool(rng, env, param):
    """max/avg/adaptive/lp pools 1-d and 2-d: ceil_mode, count_include_pad, divisor_override,
    dilation, return_indices; max pools on values without ties."""
    nd = rng.choice((1, 2))
    kind = rng.choice(("max", "max", "avg", "avg", "adaptive_avg", "adaptive_max", "lp"))
    x, _ = _spatial(rng, env, param, nd, _distinct if "max" in kind else _always, lo=2)
    k = rng.randint(1, 3)
    stride = rng.choice(("None", 1, 2))
    pad = rng.randint(0, k // 2)
    ceil = rng.choice(("True", "False"))
    if kind == "max":
        part = rng.choice(("", "", "[0]", "[1]"))
        indices = f", return_indices=True){part}" if part else ")"
        return (f"{F}.max_pool{nd}d({x}, {k}, stride={stride}, padding={pad}, "
                f"dilation={rng.choice((1, 2))}, ceil_mode={ceil}{indices}")
    if kind == "avg":
        divisor = f", divisor_override={rng.choice((None, 2, 3))}" if nd == 2 else ""
        return (f"{F}.avg_pool{nd}d({x}, {k}, stride={stride}, padding={pad}, ceil_mode={ceil}, "
                f"count_include_pad={rng.choice(('True', 'False'))}{divisor})")
    if kind == "lp":
        return f"{F}.lp_pool{nd}d({x}, {rng.choice((1, 2))}, {k}, stride={stride}, " \
               f"ceil_mode={ceil})"
    size = rng.randint(1, 4) if nd == 1 else rng.choice((rng.randint(1, 4), (2, None), (3, 1)))
    return f"{F}.{kind}_pool{nd}d({x}, {size})" + ("[0]" if kind == "adaptive_max" else "")


def _normalizes_one_element(count: int) -> bool:
    """Whether a normalization reads groups of one element: their exact result is 0, which
    eager CPU's float32 kernels leave as their rounding of ``x * rstd - mean * rstd`` with
    ``rstd = 1/sqrt(eps)``, up to 2e-5 in values and 1e-4 in a weight's gradient (seeds 7325,
    7462, 7524). Such a layer is not drawn."""
    return count == 1


@layer(4)
def normalization(rng, env, param):
    """layer_norm, rms_norm, group_norm, instance_norm, batch_norm (training and eval, the
    running statistics inputs written in place in training)."""
    kind = rng.choice(("layer", "rms", "group", "batch", "batch", "instance"))
    eps = rng.choice((1e-5, 1e-3, 0.1))
    if kind in ("layer", "rms"):
        x, shape = _any_act(rng, env, param)
        normalized = shape[-rng.randint(1, min(2, len(shape))):]
        w, b = _maybe(rng, param, normalized), _maybe(rng, param, normalized)
        if kind == "layer" and _normalizes_one_element(math.prod(normalized)):
            return None
        if kind == "rms":
            return f"{F}.rms_norm({x}, {list(normalized)}, {w}, eps={rng.choice((None, eps))})"
        return f"{F}.layer_norm({x}, {list(normalized)}, {w}, {b}, eps={eps})"
    x, shape = _act(rng, env, param, [(1, 3), (1, 4)] + [(1, 4)] * rng.randint(0, 2))
    c = shape[1]
    # batch_norm's weight and running statistics are never expanded: eager CPU's backward
    # reads a weight or statistics of stride != 1 as if contiguous when the input has one
    # element per channel and sample ((N, C) or (N, C, 1)) and returns garbage (torch 2.13,
    # seed 6002): the reference must not be the wrong one
    w = _maybe(rng, param, (c,), distinct=kind != "group")
    b = _maybe(rng, param, (c,))
    if kind == "group":
        per_channel = math.prod(shape[2:])
        fits = [g for g in (1, 2, 3, 4)
                if c % g == 0 and not _normalizes_one_element(c // g * per_channel)]
        if not fits:
            return None
        groups = rng.choice(fits)
        return f"{F}.group_norm({x}, {groups}, {w}, {b}, eps={eps})"
    training = rng.choice(("True", "False"))
    momentum = rng.choice((0.1, 0.5, 1.0))
    stats = training == "False" or rng.random() < 0.7
    mean = param((c,), grad=False, distinct=True) if stats else "None"
    var = param((c,), grad=False, positive=True, distinct=True) if stats else "None"
    if kind == "instance":
        return (f"{F}.instance_norm({x}, {mean}, {var}, {w}, {b}, "
                f"use_input_stats={training}, momentum={momentum}, eps={eps})")
    return (f"{F}.batch_norm({x}, {mean}, {var}, {w}, {b}, training={training}, "
            f"momentum={momentum}, eps={eps})")


@layer(3)
def embedding(rng, env, param):
    """embedding with padding_idx, max_norm (which renormalizes the weight in place) and
    scale_grad_by_freq, indices with repeats."""
    num, dim = rng.randint(2, 6), rng.randint(1, 4)
    max_norm = rng.choice((None, None, 1.0, 2.5))
    w = param((num, dim), distinct=max_norm is not None)  # renormalized in place: no overlap
    shape = rng.choice(((rng.randint(1, 5),), (2, rng.randint(1, 3))))
    flat = [rng.randrange(num) for _ in range(shape[0] * (shape[1] if len(shape) > 1 else 1))]
    idx = flat if len(shape) == 1 else [flat[i * shape[1]:(i + 1) * shape[1]]
                                        for i in range(shape[0])]
    padding = rng.choice((None, None, rng.randrange(num), -1))
    norm = f", norm_type={rng.choice((1.0, 2.0))}" if max_norm else ""
    return (f"{F}.embedding(torch.tensor({idx}, device={w}.device), {w}, padding_idx={padding}, "
            f"max_norm={max_norm}{norm}, scale_grad_by_freq={rng.choice(('True', 'False'))})")


@layer(1)
def dropout(rng, env, param):
    """Dropouts that keep every value: p=0, or not training."""
    x, _ = _any_act(rng, env, param)
    return rng.choice((f"{F}.dropout({x}, 0.0)", f"{F}.dropout({x}, 0.5, training=False)",
                       f"{F}.dropout1d({x}, 0.3, training=False)",
                       f"{F}.dropout2d({x}, 0.0)", f"{F}.alpha_dropout({x}, 0.2)",
                       f"{F}.feature_alpha_dropout({x}, 0.4, training=False)"))


@layer(3)
def softmax(rng, env, param):
    """softmax/log_softmax/softmin over any dim, with a dtype."""
    x, shape = _any_act(rng, env, param)
    d = rng.randrange(-len(shape), len(shape))
    op = rng.choice(("softmax", "log_softmax", "softmin"))
    # a dtype that is never wider than the input's: a float64 result of float32 values would
    # be held to float64's tolerance with float32's rounding in it
    dtype = rng.choice(("", "", ", dtype=torch.float32"))
    if param.dtype is torch.float64:
        # nor narrower: the gradients of a float64 program would be held to float64's
        # tolerance with float32's rounding in them (seed 7458)
        dtype = ""
    return f"{F}.{op}({x}, dim={d}{dtype})"


def _targets(rng, n, c, extra, ignore):
    """A literal list of class indices of shape (n, *extra), some equal to ``ignore``."""
    def one():
        return ignore if ignore is not None and rng.random() < 0.2 else rng.randrange(c)
    if extra:
        return [[one() for _ in range(extra[0])] for _ in range(n)]
    return [one() for _ in range(n)]


@layer(4)
def classification(rng, env, param):
    """cross_entropy (class indices or probabilities, label_smoothing, ignore_index, class
    weights, reduction) and nll_loss, on (N, C) and (N, C, d) inputs."""
    x, shape = _act(rng, env, param, [(1, 4), (2, 4)] + [(1, 3)] * rng.randint(0, 1))
    n, c, extra = shape[0], shape[1], shape[2:]
    reduction = rng.choice(("'mean'", "'sum'", "'none'"))
    weight = param((c,), grad=False, positive=True) if rng.random() < 0.4 else "None"
    ignore = rng.choice((None, -100, rng.randrange(c)))
    ignore_arg = f", ignore_index={ignore}" if ignore is not None else ""
    target = f"torch.tensor({_targets(rng, n, c, extra, ignore)}, device={x}.device)"
    if rng.random() < 0.5:
        logits = x if rng.random() < 0.3 else f"{x}.log_softmax(1)"
        return f"{F}.nll_loss({logits}, {target}, {weight}{ignore_arg}, reduction={reduction})"
    smoothing = rng.choice((0.0, 0.1, 0.3))
    if rng.random() < 0.25:  # probabilities, which may require grad too
        target, ignore_arg = f"{param(shape, grad=rng.random() < 0.5)}.softmax(1)", ""
    return (f"{F}.cross_entropy({x}, {target}, {weight}{ignore_arg}, reduction={reduction}, "
            f"label_smoothing={smoothing})")


@layer(3)
def regression(rng, env, param):
    """mse/l1/smooth_l1/huber, kl_div, binary cross entropy (with logits and pos_weight) and
    a few margin losses against a target that may require grad."""
    x, shape = _any_act(rng, env, param)
    y = pick(rng, env, lambda t: t.is_floating_point() and tuple(t.shape) == shape)
    if y is None or y == x or rng.random() < 0.4:
        y = param(shape, grad=rng.random() < 0.6)
    reduction = rng.choice(("'mean'", "'sum'", "'none'"))
    return rng.choice((
        f"{F}.mse_loss({x}, {y}, reduction={reduction})",
        f"{F}.l1_loss({x}, {y}, reduction={reduction})",
        f"{F}.smooth_l1_loss({x}, {y}, reduction={reduction}, beta={rng.choice((0.5, 1.0, 2.0))})",
        f"{F}.huber_loss({x}, {y}, reduction={reduction}, delta={rng.choice((0.3, 1.0, 1.7))})",
        f"{F}.kl_div({x}.log_softmax(-1), {y}.softmax(-1), reduction="
        f"{rng.choice(('batchmean', 'sum', 'none', 'mean'))!r})",
        f"{F}.kl_div({x}.log_softmax(-1), {y}.log_softmax(-1), reduction='sum', log_target=True)",
        f"{F}.binary_cross_entropy_with_logits({x}, {y}.sigmoid(), reduction={reduction}, "
        f"pos_weight={param(shape[-1:], grad=False, positive=True)})",
        f"{F}.binary_cross_entropy({x}.sigmoid(), {y}.sigmoid(), reduction={reduction})",
        f"{F}.soft_margin_loss({x}, {y}.sign(), reduction={reduction})",
        f"{F}.poisson_nll_loss({x}, {y}.abs(), reduction={reduction})",
        f"{F}.cosine_similarity({x}, {y}, dim=-1)",
        f"{F}.pairwise_distance({x}, {y}, p={rng.choice((1.0, 2.0, 3.0))})"))


@layer(3)
def interpolate(rng, env, param):
    """interpolate in every mode, by size or scale_factor, align_corners, antialias."""
    nd = rng.choice((1, 2))
    x, shape = _spatial(rng, env, param, nd, lo=2)
    modes = ["nearest", "nearest-exact", "area"] + (["linear"] if nd == 1 else
                                                    ["bilinear", "bicubic"])
    mode = rng.choice(modes)
    extra = ""
    if mode in ("linear", "bilinear", "bicubic"):
        extra = f", align_corners={rng.choice(('True', 'False'))}"
        if mode != "linear" and rng.random() < 0.3:
            extra += ", antialias=True"
    if rng.random() < 0.5:
        size = tuple(rng.randint(1, 8) for _ in range(nd))
        return f"{F}.interpolate({x}, size={size}, mode={mode!r}{extra})"
    scale = rng.choice((0.5, 1.5, 2.0, 1.7, 3.0))
    recompute = rng.choice(("None", "True"))
    return (f"{F}.interpolate({x}, scale_factor={scale}, mode={mode!r}{extra}, "
            f"recompute_scale_factor={recompute})")


@layer(3)
def pad(rng, env, param):
    """pad in every mode over the last one or two dims (constant pads may crop)."""
    mode = rng.choice(("constant", "constant", "reflect", "replicate", "circular"))
    nd = rng.choice((1, 2))
    x, shape = _spatial(rng, env, param, nd, lo=2)
    low = -1 if mode == "constant" else 0
    pads = tuple(rng.randint(low, 2) for _ in range(2 * nd))
    value = f", value={rng.choice((0.0, -1.5, 2.0))}" if mode == "constant" else ""
    return f"{F}.pad({x}, {pads}, mode={mode!r}{value})"


@layer(3)
def attention(rng, env, param):
    """scaled_dot_product_attention: bool and float masks (a float mask may require grad),
    is_causal, scale, grouped key/value heads."""
    q, shape = _act(rng, env, param, [(1, 2), (1, 2), (1, 4), (1, 4)])
    n, h, length, e = shape
    s, ev = rng.randint(1, 4), rng.randint(1, 4)
    k, v = param((n, h, s, e)), param((n, h, s, ev))
    mask = rng.choice(("none", "bool", "float", "causal"))
    args = ""
    if mask == "bool":
        rows = [[rng.random() < 0.7 for _ in range(s)] for _ in range(length)]
        args = f", attn_mask=torch.tensor({rows}, device={q}.device)"
    elif mask == "float":
        args = f", attn_mask={param((length, s), grad=rng.random() < 0.5)}"
    elif mask == "causal":
        args = ", is_causal=True"
    scale = rng.choice(("", "", ", scale=0.5", ", scale=2.0"))
    return f"{F}.scaled_dot_product_attention({q}, {k}, {v}{args}{scale})"


@layer(4)
def activation(rng, env, param):
    """The activations: gelu (tanh too), silu, mish, elu, selu, celu, leaky_relu, prelu,
    hardswish, hardsigmoid, hardtanh, softplus, logsigmoid, relu6, glu, softsign, tanhshrink,
    threshold, hard/softshrink."""
    x, shape = _any_act(rng, env, param)
    forms = [f"{F}.gelu({x})", f"{F}.gelu({x}, approximate='tanh')", f"{F}.silu({x})",
             f"{F}.mish({x})", f"{F}.elu({x}, alpha={rng.choice((1.0, 0.5))})",
             f"{F}.selu({x})", f"{F}.celu({x}, alpha=1.5)",
             f"{F}.leaky_relu({x}, {rng.choice((0.01, 0.2))})", f"{F}.hardswish({x})",
             f"{F}.hardsigmoid({x})", f"{F}.hardtanh({x}, -0.5, 1.25)",
             f"{F}.softplus({x}, beta={rng.choice((1.0, 2.0))}, threshold={rng.choice((20, 1))})",
             f"{F}.logsigmoid({x})", f"{F}.relu6({x} * 4)", f"{F}.softsign({x})",
             f"{F}.tanhshrink({x})", f"{F}.threshold({x}, 0.3, -1.0)",
             f"{F}.hardshrink({x}, 0.5)", f"{F}.softshrink({x}, 0.5)", f"{F}.relu({x})",
             f"torch.tanh({x})", f"torch.sigmoid({x})"]
    if len(shape) >= 2:
        forms.append(f"{F}.prelu({x}, {param(rng.choice(((1,), (shape[1],))))})")
    even = [d for d in range(len(shape)) if shape[d] % 2 == 0]
    if even:
        forms.append(f"{F}.glu({x}, dim={rng.choice(even)})")
    return rng.choice(forms)


@layer(3)
def reshape(rng, env, param):
    """Views of earlier values, so that layers meet transposed, strided and sliced inputs."""
    x, shape = _any_act(rng, env, param)
    forms = [f"{x}.reshape(-1)", f"{x}.unsqueeze(0)", f"{x}.flip(0)", f"{x}[::2]",
             f"{x}[1:]" if shape[0] > 1 else f"{x}[:1]", f"{x}.expand(2, *{x}.shape)"]
    if len(shape) >= 2:
        forms += [f"{x}.transpose(0, 1)", f"{x}.mT", f"{x}[:, ::2]",
                  f"{x}.permute({', '.join(map(str, reversed(range(len(shape)))))})",
                  f"{x}.reshape({shape[0]}, -1)", f"{x}.flatten(1)", f"{x}.unflatten(0, (1, -1))"]
    return rng.choice(forms)


@layer(3)
def pointwise(rng, env, param):
    """Arithmetic between values (broadcast) and elementwise ops on the way between layers."""
    x, shape = _any_act(rng, env, param)
    y = pick(rng, env, lambda t: t.is_floating_point() and _broadcasts(t.shape, shape))
    if y is None or rng.random() < 0.3:
        y = param(shape[rng.randint(0, len(shape)):] or (1,), grad=rng.random() < 0.7)
    return rng.choice((f"({x} + {y})", f"({x} * {y})", f"({x} - {y})", f"({x} / ({y}.abs() + 1))",
                       f"torch.where({x} > {y}, {x}, {y})", f"torch.maximum({x}, {y})",
                       f"{x}.exp()", f"{x}.sin()", f"{x}.pow(2)", f"{x}.abs()",
                       f"{x}.clamp(-0.5, 0.75)", f"({x} * 0.5).exp().log1p()",
                       f"torch.addcmul({x}, {x}, {y}, value=0.5)", f"{x}.sqrt()",
                       f"torch.lerp({x}, {y}, 0.25)"))


def _broadcasts(a, b) -> bool:
    try:
        torch.broadcast_shapes(a, b)
    except RuntimeError:
        return False
    return True


@layer(3)
def reduction(rng, env, param):
    """Reductions and their gradients: sum/mean/var/std over dims, amax/max (values without
    ties), logsumexp, norms, normalize, cumsum/cumprod."""
    ties = rng.random() < 0.3
    x, shape = _any_act(rng, env, param, _distinct if ties else _always)
    d = rng.randrange(-len(shape), len(shape))
    keep = rng.choice(("True", "False"))
    if ties:
        return rng.choice((f"{x}.amax(dim={d}, keepdim={keep})", f"{x}.max(dim={d})[0]",
                           f"{x}.amin(dim={d})", f"{x}.max()", f"{x}.sort(dim={d})[0]",
                           f"{x}.topk(1, dim={d})[0]", f"{x}.cummax(dim={d})[0]"))
    return rng.choice((f"{x}.sum(dim={d}, keepdim={keep})", f"{x}.mean(dim={d})",
                       f"{x}.var(dim={d}, correction={rng.choice((0, 1))})", f"{x}.std()",
                       f"{x}.logsumexp(dim={d})", f"{x}.norm(dim={d})",
                       f"torch.linalg.vector_norm({x}, ord={rng.choice((1, 3, 'inf'))})"
                       .replace("'inf'", "float('inf')"),
                       f"{F}.normalize({x}, dim={d})", f"{x}.cumsum(dim={d})",
                       f"{x}.cumprod(dim={d})", f"{x}.prod(dim={d})", f"{x}.sum()"))


@layer(2)
def matmul(rng, env, param):
    """matmul/bmm/einsum between values, or with a new weight of any layout."""
    x, shape = _act(rng, env, param, [(1, 3)] * rng.choice((2, 3)))
    w = param((shape[-1], rng.randint(1, 4)))
    return rng.choice((f"({x} @ {w})", f"torch.matmul({x}, {w})",
                       f"torch.einsum('...i,ij->...j', {x}, {w})", f"({x} @ {x}.mT)"))


@layer(2)
def in_place(rng, env, param):
    """In-place ops on intermediate values (eager refuses those whose old value the backward
    needs; those are not kept)."""
    x = pick(rng, env, lambda t: t.is_floating_point() and t.requires_grad and not t.is_leaf)
    if x is None or not x.startswith("v"):
        return None
    return "STMT " + rng.choice((f"{x}.mul_(2)", f"{x}.add_(1.5)", f"{x}.relu_()",
                                 f"{x}.clamp_(max=0.5)", f"{x}[0].zero_()",
                                 f"{x}.sigmoid_()", f"{x}.div_(3)"))
