"""torch.save / torch.load of tpu tensors keep which tensors view one storage, as for CPU
tensors: one copy of the storage in the file, views of one storage after loading (on the tpu
device, and on the CPU with map_location="cpu"), writes through one seen through the others."""
import io
import os
import subprocess
import sys

import pytest
import torch

import torchtpu_eager  # noqa: F401


def _round_trip(obj, **load_kwargs):
    f = io.BytesIO()
    torch.save(obj, f)
    f.seek(0)
    return torch.load(f, **load_kwargs), len(f.getvalue())


def _views(base):
    """A base and views of it: a slice, a transposed reshape, a strided step."""
    return {"x": base, "tail": base[1:], "t": base.view(4, 6).t(), "step": base[::5]}


@pytest.mark.parametrize("map_location", [None, "cpu", {"tpu:0": "cpu"}])
def test_views_of_one_storage_load_as_views_of_one_storage(map_location):
    cpu = _views(torch.arange(24.0))
    loaded_cpu, _ = _round_trip(cpu)
    tpu = _views(torch.arange(24.0, device="tpu"))
    loaded, _ = _round_trip(tpu, map_location=map_location)
    device = "tpu" if map_location is None else "cpu"
    for name, want in loaded_cpu.items():
        got = loaded[name]
        assert got.device.type == device
        assert (got.shape, got.stride(), got.storage_offset()) == \
            (want.shape, want.stride(), want.storage_offset()), name
        torch.testing.assert_close(got.cpu(), want)
    # A write through the base reaches every view, as it does after loading CPU tensors.
    loaded_cpu["x"].mul_(-1)
    loaded["x"].mul_(-1)
    loaded["tail"][0] = 100.0
    loaded_cpu["tail"][0] = 100.0
    for name, want in loaded_cpu.items():
        torch.testing.assert_close(loaded[name].cpu(), want, msg=name)


def test_the_file_holds_a_shared_storage_once():
    x = torch.randn(50_000, device="tpu")
    _, alone = _round_trip({"x": x})
    _, with_views = _round_trip({"x": x, "tail": x[1:], "head": x[:100]})
    assert with_views < alone * 1.05, (alone, with_views)


def test_separate_storages_stay_separate():
    a, b = torch.zeros(4, device="tpu"), torch.zeros(4, device="tpu")
    loaded, _ = _round_trip([a, b, a[2:]])
    loaded[0].add_(1)
    torch.testing.assert_close(loaded[1].cpu(), torch.zeros(4))
    torch.testing.assert_close(loaded[2].cpu(), torch.ones(2))


def test_a_second_save_has_the_new_values():
    x = torch.zeros(3, device="tpu")
    first, _ = _round_trip({"x": x, "v": x[1:]})
    x.add_(5)
    second, _ = _round_trip({"x": x, "v": x[1:]})
    torch.testing.assert_close(first["v"].cpu(), torch.zeros(2))
    torch.testing.assert_close(second["v"].cpu(), torch.full((2,), 5.0))


def test_parameters_and_a_tpu_model_state_dict_round_trip():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).to("tpu")
    param, _ = _round_trip(model[0].weight)
    assert isinstance(param, torch.nn.Parameter) and param.requires_grad
    assert param.device.type == "tpu"
    state, _ = _round_trip(model.state_dict())
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).to("tpu")
    fresh.load_state_dict(state)
    x = torch.randn(2, 3)
    torch.testing.assert_close(fresh(x.to("tpu")).cpu(), model(x.to("tpu")).cpu())


def test_saving_in_defer_and_fuse_mode_runs_the_pending_ops():
    previous = torch.tpu.get_eager_mode()
    torch.tpu.set_eager_mode("defer_and_fuse")
    try:
        x = torch.arange(6.0, device="tpu") * 2  # still pending
        loaded, _ = _round_trip({"x": x, "v": x[3:]})
    finally:
        torch.tpu.set_eager_mode(previous)
    torch.testing.assert_close(loaded["v"].cpu(), torch.tensor([6.0, 8.0, 10.0]))
    loaded["x"].zero_()
    torch.testing.assert_close(loaded["v"].cpu(), torch.zeros(3))


MAP_LOCATION_TPU = """
import io, torch, torchtpu_eager
def round_trip(obj):
    f = io.BytesIO()
    torch.save(obj, f)
    f.seek(0)
    return torch.load(f, map_location="tpu")
d = round_trip({"x": torch.arange(6.0, device="tpu"), "host": torch.ones(2)})
d["x"][2:].fill_(-1.0)
print(d["x"].device, d["x"].cpu().tolist(), d["host"].device, d["host"].tolist())
"""


def test_map_location_tpu_loads_tpu_tensors_on_the_device_and_keeps_host_ones():
    """A storage cannot be put on the tpu device: PyTorch's PrivateUse1 deserializer would
    allocate one and crash the process (a subprocess, then). Tensors saved from the tpu device
    load on it; tensors saved from the host stay there, with a warning that says so."""
    done = subprocess.run([sys.executable, "-c", MAP_LOCATION_TPU], capture_output=True,
                          text=True, timeout=300, cwd=os.path.dirname(__file__))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == \
        "tpu:0 [0.0, 1.0, -1.0, -1.0, -1.0, -1.0] cpu [1.0, 1.0]", done.stdout
    assert "tensors saved from the host stay on the host" in done.stderr


def test_storages_have_an_identity_as_on_cuda():
    # untyped_storage().data_ptr() raised ("invalid python storage"): code that tells storages
    # apart by it (transformers' save_pretrained, safetensors) failed on a tpu model.
    base = torch.arange(24.0, device="tpu")
    views = _views(base)
    other = torch.arange(24.0, device="tpu")
    ptr = base.untyped_storage().data_ptr()
    assert ptr != 0 and ptr != other.untyped_storage().data_ptr()
    for name, view in views.items():
        assert view.untyped_storage().data_ptr() == ptr, name
        assert view.untyped_storage().nbytes() == base.untyped_storage().nbytes() == 96, name
    param = torch.nn.Parameter(base)
    assert param.untyped_storage().data_ptr() == ptr


def test_save_pretrained_of_a_tpu_model_loads_back_as_the_cpu_model(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                      num_attention_heads=2, intermediate_size=32,
                                      tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.to("tpu").save_pretrained(tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    ids = torch.randint(0, 64, (1, 5))
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    torch.testing.assert_close(loaded(ids).logits, model.cpu()(ids).logits)
