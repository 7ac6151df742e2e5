"""A warm start never changes a result: user code run in a cold process, then in a warm one
over the same compile cache (executables, lowered StableHLO, aot_autograd results, Dynamo's
frames), gives the cold results bit for bit, and both match eager CPU.

The representative here: an MLP trained under OneCycleLR, which cycles SGD's momentum and lr
(floats Dynamo passes as tensors), forward, backward and the optimizer step compiled. More
workloads (Adam/NAdam/RAdam under schedulers, dropout train/eval, a tiny Llama trained with
transformers' warmup schedule and its greedy generate()): tests/slow/test_warm_start_full.py.
The whole suite warm: ``make test-warm``.
"""
from tests.support.warm_workloads import check_cold_warm_eager


def test_sgd_momentum_under_onecycle_warm_as_cold(tmp_path):
    check_cold_warm_eager("sgd_momentum_onecycle", tmp_path / "cache")
