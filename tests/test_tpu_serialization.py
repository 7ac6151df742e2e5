"""torch.save / torch.load of tpu tensors keep which tensors view one storage, as for CPU
tensors: one copy of the storage in the file, views of one storage after loading (on the tpu
device, and on the CPU with map_location="cpu"), writes through one seen through the others."""
import io
import os
import pickle
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


# A callable is asked for each storage, as torch.load asks it: CUDA checkpoints load on CPU
# machines with "lambda storage, loc: storage"; None keeps the saved device. Every callable
# raised "Callable map_location not supported with _rebuild_wrapper_subclass".
@pytest.mark.parametrize("map_location, device", [
    (None, "tpu"), ("cpu", "cpu"), ({"tpu:0": "cpu"}, "cpu"),
    (lambda storage, loc: storage, "cpu"), (lambda storage, loc: storage.cpu(), "cpu"),
    (lambda storage, loc: None, "tpu")],
    ids=["none", "cpu", "dict", "callable_identity", "callable_cpu", "callable_none"])
def test_views_of_one_storage_load_as_views_of_one_storage(map_location, device):
    cpu = _views(torch.arange(24.0))
    loaded_cpu, _ = _round_trip(cpu)
    tpu = _views(torch.arange(24.0, device="tpu"))
    loaded, _ = _round_trip(tpu, map_location=map_location)
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
print(d["x"].device, d["x"].cpu().tolist(), d["host"].device, d["host"].cpu().tolist())
"""


def test_map_location_tpu_loads_every_tensor_on_the_device():
    """In a subprocess: were the tpu deserializer not registered, PyTorch's PrivateUse1 one
    would allocate a tpu storage and crash the process. Tensors saved from the host stayed
    there, with a warning; CUDA puts them on the device."""
    done = subprocess.run([sys.executable, "-c", MAP_LOCATION_TPU], capture_output=True,
                          text=True, timeout=300, cwd=os.path.dirname(__file__))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == \
        "tpu:0 [0.0, 1.0, -1.0, -1.0, -1.0, -1.0] tpu:0 [1.0, 1.0]", done.stdout


def _host_saved():
    base = torch.arange(24.0)
    return {**_views(base), "long": torch.arange(5), "bool": torch.tensor([True, False]),
            "empty": torch.empty(0), "half": base.half(), "param": torch.nn.Parameter(base[:3])}


@pytest.mark.parametrize("map_location", ["tpu", "tpu:0", torch.device("tpu"), {"cpu": "tpu"}])
@pytest.mark.parametrize("mmap", [False, True])
def test_host_saved_tensors_load_on_the_device_as_views_of_one_storage(map_location, mmap,
                                                                       tmp_path):
    saved = _host_saved()
    path = tmp_path / "host.pt"
    torch.save(saved, path)
    want = torch.load(path)
    got = torch.load(path, map_location=map_location, mmap=mmap)
    for name, w in want.items():
        g = got[name]
        assert g.device == torch.device("tpu", 0) and g.dtype == w.dtype, name
        assert (g.shape, g.stride(), g.storage_offset()) == \
            (w.shape, w.stride(), w.storage_offset()), name
        assert isinstance(g, torch.nn.Parameter) == isinstance(w, torch.nn.Parameter), name
        assert g.requires_grad == w.requires_grad, name
        assert torch.equal(g.detach().cpu(), w.detach()), name
    for loaded in (want, got):
        loaded["x"].add_(1)
    for name in ("tail", "t", "step"):  # views of x see the write, as on the CPU
        assert torch.equal(got[name].cpu(), want[name]), name


def test_legacy_format_checkpoints_load_their_values(tmp_path):
    # torch.save(..., _use_new_zipfile_serialization=False), every checkpoint before PyTorch
    # 1.6: the loader rebuilds tensors before it reads the storages' bytes, and uploading at
    # rebuild loaded garbage (an int64 5 came back as 139656630836544), on tpu-saved files
    # and on host-saved ones loaded with map_location="tpu".
    path = tmp_path / "legacy.pt"
    tpu = {**_views(torch.arange(24.0, device="tpu")), "long": torch.tensor(5, device="tpu")}
    torch.save(tpu, path, _use_new_zipfile_serialization=False)
    got = torch.load(path)
    for name, want in tpu.items():
        assert got[name].device == want.device and torch.equal(got[name].cpu(), want.cpu()), name
    got["x"].mul_(-1)  # still views of one storage
    assert torch.equal(got["tail"].cpu(), -torch.arange(1.0, 24.0))
    saved = _host_saved()
    torch.save(saved, path, _use_new_zipfile_serialization=False)
    got = torch.load(path, map_location="tpu")
    for name, want in saved.items():
        assert got[name].device == torch.device("tpu", 0), name
        assert torch.equal(got[name].detach().cpu(), want.detach()), name


@pytest.mark.parametrize("map_location", ["cpu", torch.device("cpu"), {"tpu:0": "cpu"},
                                          lambda storage, location: storage],
                         ids=["str", "device", "dict", "callable"])
def test_legacy_format_files_saved_from_the_device_honour_map_location(tmp_path, map_location):
    # The legacy loader does not publish its map_location: tensors saved from tpu came back
    # on tpu whatever it said.
    path = tmp_path / "legacy.pt"
    saved = _views(torch.arange(24.0, device="tpu"))
    torch.save(saved, path, _use_new_zipfile_serialization=False)
    got = torch.load(path, map_location=map_location)
    for name, want in saved.items():
        assert got[name].device.type == "cpu", name
        assert torch.equal(got[name], want.cpu()), name


def test_pickle_round_trips_tpu_tensors_and_state_dicts():
    # Plain pickle (multiprocessing, caches, deep-copying libraries) gets a tensor's host copy
    # from a nested legacy-format load that has read it already; taken for one still to read
    # (the legacy-load fix above), every tensor came back as zeros.
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to("tpu")
    tensors = {**_views(torch.arange(24.0, device="tpu")), **model.state_dict()}
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        got = pickle.loads(pickle.dumps(tensors, protocol=protocol))
        for name, want in tensors.items():
            assert got[name].device == want.device, name
            assert torch.equal(got[name].cpu(), want.cpu()), name


def test_a_host_checkpoint_resumes_training_on_the_device(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(4, 3)
    model(x).sum().backward()
    opt.step()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / "ck.pt")
    state = torch.load(tmp_path / "ck.pt", map_location="tpu")
    assert state["model"]["weight"].device.type == "tpu"
    resumed = torch.nn.Linear(3, 2).to("tpu")
    resumed_opt = torch.optim.Adam(resumed.parameters())
    resumed.load_state_dict(state["model"])
    resumed_opt.load_state_dict(state["opt"])
    for m, o, inp in ((model, opt, x), (resumed, resumed_opt, x.to("tpu"))):
        o.zero_grad()
        m(inp).sum().backward()
        o.step()
    torch.testing.assert_close(resumed.weight.detach().cpu(), model.weight.detach())


def test_setting_a_tpu_tensor_to_a_host_storage_raises_as_cuda_does():
    with pytest.raises(RuntimeError, match="the devices must match"):
        torch.empty(0, device="tpu").set_(torch.arange(3.0).untyped_storage())


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


_LOAD_WITHOUT_TORCHTPU = """
import sys, torch
sys.modules["torchtpu_eager"] = sys.modules["torchtpu_compile"] = None  # not installed
host = torch.load(sys.argv[2])
for kwargs in ({"map_location": "cpu"}, {"map_location": lambda storage, loc: storage},
               {"map_location": "cpu", "weights_only": False}):
    got = torch.load(sys.argv[1], **kwargs)
    assert got.keys() == host.keys()
    for name, want in host.items():
        assert type(got[name]) is type(want) and got[name].dtype == want.dtype, name
        assert torch.equal(got[name], want), name
    got["x"][1] = 100
    assert got["tail"][0] == 100  # views of one storage, as saved
try:
    torch.load(sys.argv[1])
except RuntimeError as error:
    assert "tpu:0" in str(error), error
else:
    raise AssertionError("loaded on a device that is not there")
print("loaded")
"""


def test_a_checkpoint_saved_from_the_device_loads_where_torchtpu_is_not(tmp_path):
    # As a CUDA checkpoint loads on a CPU machine with map_location="cpu". Tensors were saved
    # through a torchtpu function: the default weights-only load refused it ("Unsupported
    # global") wherever torchtpu was not imported, and any load failed where it is not
    # installed.
    x = torch.arange(24.0, device="tpu")
    saved = {"x": x, "tail": x[1:], "t": x.view(4, 6).t(),
             "mask": torch.tensor([True, False], device="tpu"),
             "half": torch.randn(3, device="tpu").bfloat16(),
             "ids": torch.arange(3, device="tpu"),
             "z": torch.randn(2, dtype=torch.complex64).to("tpu"),
             "weight": torch.nn.Parameter(torch.ones(2, device="tpu"))}
    torch.save(saved, tmp_path / "tpu.pt")
    torch.save({name: torch.nn.Parameter(t.detach().cpu()) if isinstance(t, torch.nn.Parameter)
                else t.cpu() for name, t in saved.items()}, tmp_path / "host.pt")
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_WITHOUT_TORCHTPU, str(tmp_path / "tpu.pt"),
         str(tmp_path / "host.pt")], capture_output=True, text=True, timeout=300,
        env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert done.returncode == 0 and "loaded" in done.stdout, done.stderr[-3000:]


def _safetensors_file(tmp_path):
    tensors = {"w": torch.randn(3, 8), "ids": torch.arange(8).reshape(2, 4),
               "half": torch.randn(2, 4, dtype=torch.bfloat16),
               "mask": torch.tensor([True, False, True, True]), "scalar": torch.tensor(2.5)}
    path = str(tmp_path / "t.safetensors")
    pytest.importorskip("safetensors.torch").save_file(tensors, path)
    return path, tensors


def test_safetensors_device_index_loads_cpus_tensors_on_the_device(tmp_path):
    # safetensors hands an int device to torch, which takes it as the current accelerator's
    # index: each tensor's bytes are uploaded and viewed as its dtype on the device, the
    # widening views (uint8 -> float32, int64) with no host fallback (docs/migration.md).
    from safetensors.torch import load_file, load_model, safe_open, save_model
    from torchtpu_compile import config
    path, want = _safetensors_file(tmp_path)
    with config.patch(strict=True):
        loaded = load_file(path, device=torch.tpu.current_device())
        with safe_open(path, framework="pt", device=0) as f:
            opened = {name: f.get_tensor(name) for name in f.keys()}
            part = f.get_slice("w")[1:, :5]
    for got in (loaded, opened):
        assert got.keys() == want.keys()
        for name, t in want.items():
            assert got[name].device == torch.device("tpu", 0) and got[name].dtype == t.dtype
            assert torch.equal(got[name].cpu(), t), name
    assert part.device.type == "tpu" and torch.equal(part.cpu(), want["w"][1:, :5])
    source, model = torch.nn.Linear(8, 3), torch.nn.Linear(8, 3).to("tpu")
    save_model(source, str(tmp_path / "m.safetensors"))
    assert load_model(model, str(tmp_path / "m.safetensors"), device=0) == (set(), [])
    assert torch.equal(model.weight.detach().cpu(), source.weight.detach())


@pytest.mark.parametrize("device", ["tpu", "tpu:0", torch.device("tpu")])
def test_safetensors_refuses_the_tpu_device_by_name(tmp_path, device):
    # safetensors' own (Rust) device parser knows a fixed list of names (cuda, mps, npu, xpu,
    # xla, mlu, hpu, ...), not a PrivateUse1 device's: docs/migration.md gives device=0. When
    # safetensors accepts "tpu", this fails and that line can leave the guide.
    from safetensors.torch import load_file
    path, _ = _safetensors_file(tmp_path)
    with pytest.raises(Exception, match=r"device .*tpu.* is invalid"):
        load_file(path, device=device)
