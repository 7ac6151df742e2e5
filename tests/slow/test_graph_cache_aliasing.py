"""The graph cache and inputs that alias each other (a few seconds of compiles: slow)."""
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
