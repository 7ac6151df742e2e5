"""Compiled graphs given inputs that alias each other, one a view of the other, where the graph
writes one: eager's values or an error, never the values of separate inputs (a few seconds of
compiles each: slow)."""
import pytest
import torch

from tests.support.helpers import compile_tpu
from tests.test_graph_cache import counts, first_compile_then_variant, isolated_cache  # noqa: F401

pytestmark = pytest.mark.slow


def test_inputs_that_alias_do_not_hit_the_entry_of_separate_ones(isolated_cache):  # noqa: F811
    # aot_autograd compiles a mutated input that views another through one "synthetic base":
    # another result under the same torch key. Served the separate inputs' entry, the graph
    # returned x * 1 from x before the write through its view w.
    def f(x, w):
        w.add_(1)
        return x * 1

    def call(aliased):
        x = torch.arange(8.0)
        w = x[:4] if aliased else torch.arange(4.0)
        return compile_tpu(f, dynamic=False)(x, w)

    out = first_compile_then_variant(isolated_cache, lambda: call(False), lambda: call(True))
    x = torch.arange(8.0)
    torch.testing.assert_close(out, f(x, x[:4]))  # 1, 2, 3, 4, 4, 5, 6, 7
    assert counts("aot_autograd")["hits"] == 0


def writes_w_reads_x(x, w):
    w.add_(1)
    return x * 1


def test_a_graph_compiled_for_separate_inputs_refuses_overlapping_ones():
    # Dynamo does not compile again when a later call passes aliasing inputs; the program's
    # inputs are values, so its result missed the write through the view (x before w.add_).
    compiled = compile_tpu(writes_w_reads_x, dynamic=False)
    compiled(torch.arange(8.0), torch.arange(4.0))
    x = torch.arange(8.0)
    with pytest.raises(RuntimeError, match="overlaps the memory of another"):
        compiled(x, x[:4])


def test_disjoint_views_of_one_tensor_written_by_a_graph_run():
    def write_both(k, v, new):  # a cache's key and value halves
        k[:, 0] = new
        v[:, 0] = new * 2
        return k.sum() + v.sum()

    cache, expected_cache = torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)
    compiled = compile_tpu(write_both, dynamic=False)
    for _ in range(2):
        out = compiled(cache[0], cache[1], torch.ones(3))
        expected = write_both(expected_cache[0], expected_cache[1], torch.ones(3))
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(cache, expected_cache)
