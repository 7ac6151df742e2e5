"""The graph cache across processes on a tiny GPT-2 (test_graph_cache.py does a small block)."""
import textwrap

import pytest

from tests.test_graph_cache import check_warm_hits_everything, cold_then_warm

pytestmark = pytest.mark.slow

GPT2 = textwrap.dedent("""\
    from tests.support import zoo
    model, (ids,) = zoo.gpt2()
    model.loss_type = "ForCausalLM"  # no warning inside forward, so no graph break
    out_of = lambda out: out.logits
    loss_of = lambda m, ids: m(input_ids=ids, labels=ids).loss
""")


def test_warm_gpt2_process_hits_every_graph_and_matches_the_cold_one(tmp_path):
    check_warm_hits_everything(*cold_then_warm(tmp_path / "cache", GPT2))
