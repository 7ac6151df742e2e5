"""The migration suite: CUDA-style scripts run on CPU and with the device changed to tpu.

Each script in this folder is written as a CUDA user writes it, with the device (and, where it
compiles, the backend) as the only change; its diff from the CUDA version is at its top. Each
runs here on CPU (eager, the reference) and on tpu (eager, and compiled where the script
compiles), and the losses, parameters, optimizer state and outputs must agree: tightly in
float32 (precision "highest"), within the low dtype's resolution under AMP or bfloat16.
The GCN also checks that the tpu device refuses its sparse adjacency with an actionable
error. The longer variants (float16 with GradScaler, the compiled image loop, the compiled language
model with fused and foreach AdamW, pure bfloat16) are in tests/slow/test_migration_full.py;
Hugging Face in test_migration_hf.py; DDP and FSDP2 with torch.distributed.checkpoint in
test_migration_dist.py.
"""
import pytest
import torch

import torchtpu_eager  # noqa: F401  (registers the device; autoload does too)
from torchtpu_compile import config
from tests.migration import functional_transforms, gcn, image_classification

#: (atol, rtol) by the precision a run computes in.
TOLERANCE = {"float32": (2e-4, 2e-4), "bfloat16": (6e-2, 6e-2), "float16": (1e-2, 1e-2)}


@pytest.fixture(autouse=True)
def highest_precision():
    with config.patch(matmul_precision="highest"):
        yield


def assert_same(got, want, tolerance, where="result"):
    """``got`` (a tpu run's result) equals ``want`` (the CPU run's) in structure and value."""
    atol, rtol = tolerance
    if isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for key in want:
            assert_same(got[key], want[key], tolerance, f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, tolerance, f"{where}[{i}]")
    elif isinstance(want, torch.Tensor):
        assert got.device.type == "cpu" and got.dtype == want.dtype, where
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol, msg=lambda m: f"{where}: {m}")
    elif isinstance(want, float):
        assert got == pytest.approx(want, abs=atol, rel=rtol), where
    else:
        assert got == want, where


def test_image_classification_eager():
    # bfloat16 autocast, two DataLoader workers, one epoch, checkpoint and resume.
    want = image_classification.main("cpu", epochs=1)
    got = image_classification.main("tpu", epochs=1)
    assert want["checkpoint_devices"] == got["checkpoint_devices"] == ["cpu"]
    assert_same(got, want, TOLERANCE["bfloat16"])


def test_functional_transforms():
    assert_same(functional_transforms.main("tpu"), functional_transforms.main("cpu"),
                TOLERANCE["float32"])



def test_gcn_dense_adjacency_on_tpu_is_the_sparse_run_on_cpu():
    # The tpu device holds dense tensors only: the script's sparse adjacency is refused with
    # a message naming .to_dense(), and the dense one gives the CPU's torch.sparse.mm run.
    want = gcn.main("cpu", sparse=True, epochs=2)
    with config.patch(strict=True):
        assert_same(gcn.main("tpu", sparse=False, epochs=2), want, TOLERANCE["float32"])
        with pytest.raises(NotImplementedError, match="to_dense"):
            gcn.main("tpu", sparse=True, epochs=2)

def test_migration_guide_distributed_examples_are_lines_of_the_scripts():
    # docs/migration.md's DDP and FSDP2 blocks are what tests/slow/test_migration_dist.py runs:
    # every code line of each block is a line of the script it names (comments aside).
    import os
    import re
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "migration.md")) as f:
        guide = f.read()
    section = guide.split("## DDP and FSDP2")[1].split("\n## ")[0]
    blocks = re.findall(r"\(`(tests/migration/\w+\.py)`\).*?```python\n(.*?)```", section, re.S)
    assert [path for path, _ in blocks] == ["tests/migration/ddp_train.py",
                                            "tests/migration/fsdp2_train.py"]
    for path, block in blocks:
        with open(os.path.join(root, path)) as f:
            script = {line.strip() for line in f}
        for line in block.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                assert line.strip() in script, f"{path} has no line {line.strip()!r}"
