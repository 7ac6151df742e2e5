"""torch.export + AOT artifacts: save, load elsewhere, detect damage, check inputs."""
import os
import subprocess
import sys
import textwrap
from typing import NamedTuple

import pytest
import torch

from tests.support import aot_factories, python_env
import torchtpu_compile
import torchtpu_compile.aot as aot
from torchtpu_compile.runtime import executable
from torchtpu_compile.aot import specs
from torchtpu_compile.runtime.client import get_client

def fresh_python(code, *args):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=python_env(),
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def gpt2_artifact(tmp_path_factory):
    model, (ids,) = aot_factories.gpt2()
    path = str(tmp_path_factory.mktemp("aot") / "gpt2.tpu")
    aot.compile(model, (ids,)).save(path)
    return path, model, ids


def test_fresh_process_gives_bit_identical_outputs_with_only_a_pjrt_load(gpt2_artifact, tmp_path):
    path, model, ids = gpt2_artifact
    here = aot.load(path)(ids).logits
    torch.testing.assert_close(here, model(ids).logits, rtol=0, atol=3e-2)  # medium precision
    out = tmp_path / "out.pt"
    result = fresh_python("""
        import sys, torch
        import torchtpu_compile.aot as aot
        run = aot.load(sys.argv[1])
        ids = run.example_inputs["input_ids"]
        torch.save(run(ids)[0], sys.argv[2])
        print("recompiled", run.recompiled)
        print("heavy", [m for m in ("torch_mlir", "torch._dynamo", "transformers")
                        if m in sys.modules])
    """, path, str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "recompiled False" in result.stdout
    assert "heavy []" in result.stdout  # no torch-mlir, no Dynamo: a PJRT load only
    assert torch.equal(torch.load(out), here)


def test_mismatched_platform_recompiles_from_portable_stablehlo(gpt2_artifact, monkeypatch,
                                                                 caplog, tmp_path):
    path, model, ids = gpt2_artifact
    expected = aot.load(path)(ids).logits
    monkeypatch.setattr(specs, "executable_tag", lambda client: {
        "platform_version": "tpu v5e", "jaxlib": "0.99", "xla_flags": ""})
    with torchtpu_compile.config.patch(cache_dir=str(tmp_path)):
        executable.clear_cache()  # make XLA really compile the portable StableHLO
        torchtpu_compile.reset_stats()
        with caplog.at_level("WARNING", logger="torchtpu"):
            run = aot.load(path)
        assert run.recompiled and torchtpu_compile.stats()["graphs_compiled"] == 1
        assert any("recompiling from its portable StableHLO" in r.getMessage()
                   for r in caplog.records)
        assert torch.equal(run(ids).logits, expected)


def test_an_executable_saved_under_other_xla_flags_is_compiled_again(gpt2_artifact, monkeypatch,
                                                                     caplog, tmp_path):
    # XLA flags change the code XLA emits (fast math, a TPU scheduler flag): a process under
    # other flags than the saving one's loaded the stored executable all the same.
    path, model, ids = gpt2_artifact
    expected = aot.load(path)(ids).logits
    flags = "--xla_cpu_enable_fast_math=true"
    monkeypatch.setattr(get_client(), "compile_flags", flags)   # as XLA_FLAGS sets it
    with torchtpu_compile.config.patch(cache_dir=str(tmp_path)):
        executable.clear_cache()
        with caplog.at_level("WARNING", logger="torchtpu"):
            run = aot.load(path)
        assert run.recompiled
        assert any(f"XLA flags: {flags}" in r.getMessage() for r in caplog.records)
        torch.testing.assert_close(run(ids).logits, expected)


def test_an_executable_saved_under_other_xla_options_is_compiled_again(gpt2_artifact, caplog,
                                                                       tmp_path):
    # config.excess_precision decides XLA's xla_allow_excess_precision per compile: an
    # executable saved under one setting rounds bf16 results otherwise than the other.
    path, model, ids = gpt2_artifact
    expected = aot.load(path)(ids).logits
    with torchtpu_compile.config.patch(cache_dir=str(tmp_path), excess_precision="on"):
        executable.clear_cache()
        with caplog.at_level("WARNING", logger="torchtpu"):
            run = aot.load(path)
        assert run.recompiled
        # excess precision left to XLA: only the CPU client's fusion emitters stay set
        options = "xla_cpu_use_fusion_emitters=False" if get_client().platform == "cpu" \
            else "none"
        assert any(f"XLA options: {options})" in r.getMessage() for r in caplog.records)
        torch.testing.assert_close(run(ids).logits, expected)


def test_truncated_artifact_is_a_clear_error(gpt2_artifact, tmp_path):
    path = gpt2_artifact[0]
    data = open(path, "rb").read()
    broken = tmp_path / "truncated.tpu"
    broken.write_bytes(data[: len(data) // 2])
    with pytest.raises(aot.ArtifactError, match="truncated or damaged"):
        aot.load(str(broken))


def test_tampered_artifact_is_caught_by_checksum(gpt2_artifact, tmp_path):
    import zipfile
    path = gpt2_artifact[0]
    tampered = tmp_path / "tampered.tpu"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tampered, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name == "params.safetensors":
                data = data[:-8] + bytes(8)  # zero the last weights
            dst.writestr(name, data)
    with pytest.raises(aot.ArtifactError, match="checksum mismatch in 'params.safetensors'"):
        aot.load(str(tampered))


def test_wrong_inputs_name_the_argument(gpt2_artifact):
    path, model, ids = gpt2_artifact
    run = aot.load(path)
    with pytest.raises(ValueError, match="input 'input_ids' has shape \\[2, 9\\]"):
        run(torch.zeros(2, 9, dtype=torch.int64))
    with pytest.raises(ValueError, match="input 'input_ids' .* dtype int32"):
        run(ids.int())
    with pytest.raises(TypeError, match="expected 1 inputs"):
        run(ids, ids)


def test_program_exported_in_training_mode_is_refused():
    # aot.compile puts a module in eval mode itself; a program exported in train mode updates
    # BatchNorm statistics, which an inference artifact cannot carry.
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).train()
    exported = torch.export.export(model, (torch.randn(3, 4),))
    with pytest.raises(torchtpu_compile.errors.LoweringError, match="call model.eval"):
        aot.compile(exported, (torch.randn(3, 4),))


class _Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return x * 2


def test_a_module_writing_its_buffer_is_refused_naming_the_buffer():
    # The error only said "call model.eval()", which aot.compile had already done.
    with pytest.raises(torchtpu_compile.errors.LoweringError,
                       match=r"writes 'calls' in place \(BUFFER_MUTATION\).*in-place buffer"):
        aot.compile(_Counter(), (torch.randn(3),))


def test_the_load_path_of_static_and_bucketed_artifacts_imports_no_torch_mlir():
    # The AOT loader promises a PJRT load only; a bucketed artifact also runs through
    # buckets/runner, whose imports reach into lower/ (index checks).
    result = fresh_python("""
        import sys
        import torchtpu_compile.aot.loader, torchtpu_compile.buckets.runner
        print("heavy", [m for m in ("torch_mlir", "torch._dynamo") if m in sys.modules])
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "heavy []" in result.stdout, result.stdout


class _TransposedScale(torch.nn.Module):
    def forward(self, x):
        return x.t() * 2, x + 1


def test_artifact_outputs_have_eagers_strides(tmp_path):
    # As compiled calls' (test_calling_conventions.py): x.t() * 2 has eager's strides (1, 4),
    # so y.t().view(-1) works; an artifact's outputs were contiguous. A manifest whose memory
    # order is not a permutation of the output's dims is refused.
    import json
    import zipfile
    from torchtpu_compile.aot.manifest import parse
    model, x = _TransposedScale(), torch.randn(3, 4)
    path = str(tmp_path / "t.tpu")
    aot.compile(model, (x,)).save(path)
    got, want = aot.load(path)(x), model(x)
    for g, w in zip(got, want):
        assert g.stride() == w.stride() and g._base is None
        torch.testing.assert_close(g, w)
    torch.testing.assert_close(got[0].t().view(-1), want[0].t().view(-1))
    with zipfile.ZipFile(path) as z:
        manifest = json.loads(z.read("manifest.json"))
    slot = next(s for s in manifest["programs"][0]["output_slots"] if s.get("value"))
    slot["value"] = {"memory_order": [0, 0]}
    with pytest.raises(aot.ArtifactError, match="memory_order"):
        parse(path, json.dumps(manifest).encode())


class _KeywordsAndDict(torch.nn.Module):
    def forward(self, pair, *, x, y):
        return x - 2 * y + pair["a"] * pair["b"].sum()


def test_keywords_and_dict_entries_bind_by_name(tmp_path):
    # The loader matched the call's tensors to the recorded inputs by position: run(y=y, x=x)
    # after an export with x first computed y - 2 * x, silently, and unknown names were
    # taken too. Eager binds by name, and raises on a name it does not know.
    model = _KeywordsAndDict()
    g = torch.Generator().manual_seed(0)
    a, b, x, y = (torch.randn(3, 4, generator=g) for _ in range(4))
    path = str(tmp_path / "kw.tpu")
    aot.compile(model, ({"a": a, "b": b},), {"x": x, "y": y}).save(path)
    run = aot.load(path)
    want = model({"a": a, "b": b}, x=x, y=y)
    torch.testing.assert_close(run({"b": b, "a": a}, y=y, x=x), want)
    torch.testing.assert_close(run({"a": a, "b": b}, x=x, y=y), want)
    with pytest.raises(TypeError, match=r"got keyword arguments \['x', 'z'\]; the artifact was "
                                        r"exported with \['x', 'y'\]"):
        run({"a": a, "b": b}, x=x, z=y)
    with pytest.raises(TypeError, match="the inputs are structured as"):
        run({"a": a, "c": b}, x=x, y=y)
    torch.testing.assert_close(run.run_example(), want)  # the saved inputs, in their order


def test_keywords_are_refused_where_the_input_structure_is_not_restored(tmp_path, monkeypatch):
    # An input structure naming a class not imported here was a warning, and the call's
    # keywords and dict entries were then bound by position: in another order, silently wrong.
    model = _KeywordsAndDict()
    a, b, x, y = (torch.randn(3, 4) for _ in range(4))
    path = str(tmp_path / "kw.tpu")
    aot.compile(model, ({"a": a, "b": b},), {"x": x, "y": y}).save(path)
    real, in_spec = aot.specs.load_treespec, aot.load(path).manifest["in_spec"]

    def without_the_class(text, **kwargs):
        if text == in_spec:
            raise NotImplementedError("No registered serialization name for <class 'Foo'>")
        return real(text, **kwargs)
    monkeypatch.setattr(aot.specs, "load_treespec", without_the_class)
    run = aot.load(path)
    with pytest.raises(TypeError, match=r"keyword arguments and dict inputs need the input "
                                        r"structure, and it was not restored \(No registered"):
        run({"b": b, "a": a}, y=y, x=x)
    with pytest.raises(TypeError, match="need the input structure"):
        run({"a": a, "b": b}, x, y)


class Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


class _NamedTuplesInAndOut(torch.nn.Module):
    def forward(self, pair, scale, shift):
        y = pair.a * scale + pair.b - shift
        return {"pair": Pair(y, -y), "max": y.max(0), "top": y.topk(2)}


def test_structures_pytree_cannot_serialize_keep_names_and_types(tmp_path):
    # pytree's JSON cannot name a namedtuple not registered for it, nor torch.return_types:
    # the artifact recorded no structure. Keywords were then bound in call order, silently
    # wrong (run(p, shift=s, scale=c) computed p.a * s + p.b - c), and outputs came back as a
    # flat tuple (no .values, no dict).
    model = _NamedTuplesInAndOut()
    g = torch.Generator().manual_seed(0)
    a, b, scale, shift = (torch.randn(5, generator=g) for _ in range(4))
    path = str(tmp_path / "nt.tpu")
    aot.compile(model, (Pair(a, b),), {"scale": scale, "shift": shift}).save(path)
    want = model(Pair(a, b), shift=shift, scale=scale)
    got = aot.load(path)(Pair(a, b), shift=shift, scale=scale)
    torch.testing.assert_close(got, want)  # checks the types too: Pair, dict, max, topk
    assert type(got["max"]) is torch.return_types.max and type(got["pair"]) is Pair

    # Where Pair is not imported the outputs are a namedtuple of its name and fields, and
    # keywords are refused: by position they could bind to the wrong inputs.
    result = fresh_python("""
        import sys, torch
        import torchtpu_compile.aot as aot
        run = aot.load(sys.argv[1])
        a, b, scale, shift = (torch.full((5,), float(i)) for i in (1, 2, 3, 4))
        out = run((a, b), scale, shift)
        print(type(out["pair"]).__name__, out["pair"]._fields, type(out["max"]).__name__,
              out["pair"].a.tolist())
        try:
            run((a, b), shift=shift, scale=scale)
        except TypeError as exc:
            print("refused:", exc)
    """, path)
    assert result.returncode == 0, result.stderr
    assert "Pair ('a', 'b') max [1.0, 1.0, 1.0, 1.0, 1.0]" in result.stdout, result.stdout
    assert "refused: " in result.stdout and "not restored (class tests.test_aot.Pair is not " \
        "imported here)" in result.stdout, result.stdout


def test_compile_gives_the_model_back_in_the_modes_it_came_in():
    # aot.compile exports in eval mode; it left the model there, so training after an export
    # ran without dropout and with frozen BatchNorm statistics. A submodule the user froze in
    # eval mode stays there.
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Dropout(0.5), torch.nn.BatchNorm1d(4)).train()
    model[3].eval()
    aot.compile(model, (torch.randn(3, 4),))
    assert [m.training for m in model.modules()] == [True, True, True, True, False]


def test_export_and_save_errors_name_what_is_wrong(tmp_path):
    # A bool keyword (HF's use_cache=False) was refused as "got Tensor, bool", naming no
    # argument; a save into a missing directory named mkstemp's temporary file.
    class Flagged(torch.nn.Module):
        def forward(self, x, scale=False):
            return x * 2 if scale else x + 1

    with pytest.raises(torchtpu_compile.errors.LoweringError,
                       match=r"not a tensor: keyword 'scale' \(bool\)"):
        aot.compile(Flagged(), (torch.randn(3),), {"scale": True})
    artifact = aot.compile(Flagged(), (torch.randn(3),))
    missing = tmp_path / "no_such_dir" / "m.tpu"
    with pytest.raises(FileNotFoundError, match="parent directory .*no_such_dir' does not exist"):
        artifact.save(str(missing))


def test_a_saved_artifact_has_the_mode_torch_save_gives(tmp_path):
    # Artifacts were written 0600 (mkstemp), so another user or a serving process could not
    # read one that torch.save beside it would have made readable.
    artifact = aot.compile(torch.nn.Linear(3, 2), (torch.randn(4, 3),))
    old = os.umask(0o022)
    try:
        artifact.save(str(tmp_path / "m.tpu"))
        torch.save({}, str(tmp_path / "reference.pt"))
    finally:
        os.umask(old)
    mode = (tmp_path / "m.tpu").stat().st_mode & 0o777
    assert mode == (tmp_path / "reference.pt").stat().st_mode & 0o777 == 0o644
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")]
