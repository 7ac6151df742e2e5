"""Where a graph whose inputs die is cut (program/memory_split.py), and that the pieces compute
what the whole graph does.

The memory a cut saves is checked end to end in tests/test_training_memory.py; here the plan
itself: it cuts where a large input or intermediate dies and the rest of the graph makes
large values of its own, and leaves alone a graph whose cut would save nothing, a small
graph, and a graph with symbolic sizes.
"""
from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torchtpu_compile import config
from torchtpu_compile.program import build_program
from torchtpu_compile.program.memory_split import MIN_SAVING_BYTES, plan_pieces

# Large enough that a cut clears MIN_SAVING_BYTES: each (rows x columns) f32 buffer is 32 MB.
ROWS, COLUMNS = 1024, 8192


def _head_backward(saved, grad, weight, other):
    """The shape of a language model's loss backward: a large saved input read once to make
    a gradient of its size, that gradient read by two matmuls, then work of its own size
    (``other``: the rest of the backward) that makes large results."""
    dlogits = (saved.exp() - 1.0) * grad
    dweight = dlogits.t() @ other[:, :64]
    dhidden = dlogits @ weight
    rest = [(other * float(i)).sin() for i in range(1, 3)]
    return dweight, dhidden, *rest


def _inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(ROWS, COLUMNS, generator=g), torch.randn(ROWS, 1, generator=g),
            torch.randn(COLUMNS, 64, generator=g), torch.randn(ROWS, COLUMNS, generator=g))


def test_a_graph_is_cut_after_its_large_input_dies_and_its_pieces_compute_the_whole():
    assert ROWS * COLUMNS * 4 >= 2 * MIN_SAVING_BYTES
    args = _inputs()
    gm = make_fx(_head_backward, tracing_mode="fake")(*args)
    pieces = plan_pieces(gm)
    assert pieces is not None and max(pieces) >= 1
    compute = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    first = {compute[i].target for i, p in enumerate(pieces) if p == 0}
    assert torch.ops.aten.exp.default in first  # the saved input's one reader is in piece 0
    assert torch.ops.aten.sin.default not in first  # the rest comes after it dies
    # each piece is a runner of its own, at the precision in force when it runs
    with config.patch(matmul_precision="highest", split_backward="on"):
        program = build_program(gm, precision="highest", name="head_backward",
                                inputs_die=True)
        assert program.regions == max(pieces) + 1
        got = program(list(args))
    expected = _head_backward(*args)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-2)  # sums of 1024 products


def test_a_list_handed_over_is_emptied_and_one_kept_is_not():
    args = _inputs()
    gm = make_fx(_head_backward, tracing_mode="fake")(*args)
    with config.patch(split_backward="on"):
        program = build_program(gm, precision="highest", name="head_backward",
                                inputs_die=True)
    assert program.regions > 1
    handed = list(args)
    program(handed)
    assert handed == []  # so the inputs can die between the pieces
    # without inputs_die the caller keeps its inputs: one program, the list untouched
    whole = build_program(make_fx(_head_backward, tracing_mode="fake")(*args),
                          precision="highest", name="head_backward")
    kept = list(args)
    whole(kept)
    assert len(kept) == len(args)


def test_the_cpu_client_keeps_one_program_unless_told_otherwise():
    """``split_backward="auto"`` cuts on accelerators only: on the CPU client the host's peak
    is the heap glibc keeps, and the cuts cost time (config.py)."""
    args = _inputs()
    program = build_program(make_fx(_head_backward, tracing_mode="fake")(*args),
                            precision="highest", name="head_backward", inputs_die=True,
                            platform="cpu")
    assert not hasattr(program, "regions")


def test_small_graphs_and_cuts_that_save_nothing_are_left_whole():
    small = [t[:64, :64].clone() for t in _inputs()]
    small[2] = small[2][:, :64].clone()
    assert plan_pieces(make_fx(_head_backward, tracing_mode="fake")(*small)) is None

    def elementwise(x, y):  # every input read to the end: no cut frees anything
        return (x * y).sin() + x, (x - y).cos() * y

    big = _inputs()
    assert plan_pieces(make_fx(elementwise, tracing_mode="fake")(big[0], big[3])) is None


def test_symbolic_sizes_are_left_whole():
    gm = make_fx(_head_backward, tracing_mode="symbolic")(*_inputs())
    assert plan_pieces(gm) is None
