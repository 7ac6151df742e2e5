"""Hugging Face Trainer on tpu (tests/migration/hf_trainer.py): the loss curve of a few steps
match the CPU run, eagerly and compiled, for a causal-LM Llama (and a greedy generate() after)
and a masked-LM BERT (and its scores for a masked prompt after); and generate() of a compiled
Llama (tests/migration/llama_generate.py) gives eager CPU's tokens, greedy, beam searched and
sampled on the device (tests/migration/hf_generate.py); and pipeline(), from_pretrained with a
device_map and a dtype, and save_pretrained give CPU's outputs (tests/migration/hf_pipelines.py).

Each run is a fresh process: accelerate reads ``ACCELERATE_TORCH_DEVICE`` once per process
(its state is shared), which is also how a user sets it.
"""
import json
import math
import subprocess
import sys

import pytest

from tests.support import python_env

pytestmark = pytest.mark.slow


def _run(*args: str, **env: str) -> dict:
    return _run_script("hf_trainer", *args, **env)


def _run_script(name: str, *args: str, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-m", f"tests.migration.{name}", *args],
                          capture_output=True, text=True, timeout=900, env=python_env(**env))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# compile: model.compile(backend="torchtpu"); torch_compile: TrainingArguments(torch_compile=
# True), Inductor by name, as a CUDA script has it (it crashed on tpu before torch.compile's
# default backend handed tpu graphs to torchtpu).
@pytest.mark.parametrize("compiled", [None, "compile", "torch_compile"])
def test_trainer_matches_cpu(compiled):
    want = _run("cpu")
    got = _run("tpu", *([compiled] if compiled else []), ACCELERATE_TORCH_DEVICE="tpu")
    assert (want["device"], got["device"]) == ("cpu", "tpu:0")
    assert (got["frames_compiled"] > 0) == bool(compiled)
    assert got["losses"] == pytest.approx(want["losses"], rel=1e-3)
    assert got["sample"] == want["sample"]


@pytest.mark.parametrize("compiled", [False, True])
def test_bert_trainer_matches_cpu(compiled):
    # BertForMaskedLM: token-type and position embeddings, post-norm layers, the MLM head tied
    # to the word embeddings, a loss over the masked positions only; float32 matmuls at
    # "highest" in both runs, so the curves agree to float32 rounding.
    want = _run("cpu", "bert", TORCHTPU_MATMUL_PRECISION="highest")
    got = _run("tpu", "bert", *(["compile"] if compiled else []), ACCELERATE_TORCH_DEVICE="tpu",
               TORCHTPU_MATMUL_PRECISION="highest")
    assert (want["device"], got["device"]) == ("cpu", "tpu:0")
    assert (got["frames_compiled"] > 0) == compiled
    assert len(want["losses"]) == 3
    assert got["losses"] == pytest.approx(want["losses"], rel=1e-4)
    assert got["sample"] == pytest.approx(want["sample"], abs=1e-4)


@pytest.mark.parametrize("option", ["bf16", "checkpointing"])
def test_trainer_options_match_cpu(option):
    # TrainingArguments(bf16=True): accelerate's autocast to bfloat16 on the tpu device, within
    # bfloat16's resolution of the CPU's bf16 curve; gradient_checkpointing=True recomputes
    # each layer in the backward, to float32 rounding at "highest".
    want = _run("cpu", option, TORCHTPU_MATMUL_PRECISION="highest")
    got = _run("tpu", option, ACCELERATE_TORCH_DEVICE="tpu", TORCHTPU_MATMUL_PRECISION="highest")
    assert (want["device"], got["device"]) == ("cpu", "tpu:0") and len(want["losses"]) == 3
    rel = 1e-3 if option == "bf16" else 1e-5
    assert got["losses"] == pytest.approx(want["losses"], rel=rel)
    assert got["sample"] == want["sample"]


def test_accelerate_refuses_fp16_on_the_tpu_device():
    # TrainingArguments(fp16=True): accelerate's Accelerator names the device types it gives
    # fp16 AMP (cuda, xpu, npu, mps, ...; torch_xla's TPU excluded), so no property of ours can
    # satisfy it; docs/migration.md gives bf16=True. If accelerate accepts "tpu" one day, this
    # fails and that paragraph can change.
    done = subprocess.run([sys.executable, "-m", "tests.migration.hf_trainer", "tpu", "fp16"],
                          capture_output=True, text=True, timeout=900,
                          env=python_env(ACCELERATE_TORCH_DEVICE="tpu"))
    assert done.returncode != 0
    assert "fp16 mixed precision requires a device in" in done.stderr
    assert "(not 'tpu')" in done.stderr


def test_compiled_generate_matches_cpu():
    # Greedy generate() of a compiled Llama on tpu (tests/migration/llama_generate.py): the
    # forward builds tensors on the device (torch.tensor(..., device=...)), which Dynamo once
    # failed to trace; the tokens must be eager CPU's, with no graph break of ours.
    want = _run_script("llama_generate", "cpu")
    got = _run_script("llama_generate", "tpu")
    assert (want["device"], got["device"]) == ("cpu", "tpu:0")
    assert got["tokens"] == want["tokens"] and len(got["tokens"][0]) == 8
    assert got["graph_breaks"] == {}


def _cpu_and_device_runs(script: str, run: str) -> tuple[dict, dict]:
    """``script``'s results on the CPU and on the tpu device, ``run`` being "strict",
    "defer_and_fuse" (both with host fallbacks refused) or "compile" (the model compiled)."""
    want = _run_script(script, "cpu")
    env = {"strict": dict(TORCHTPU_STRICT="1"),
           "defer_and_fuse": dict(TORCHTPU_STRICT="1", TORCH_TPU_DEFER_AND_FUSE="1"),
           "compile": {}}[run]
    got = _run_script(script, "tpu", *(["compile"] if run == "compile" else []), **env)
    assert (want["device"], got["device"]) == ("cpu", "tpu:0")
    return want, got


@pytest.mark.parametrize("run", ["strict", "defer_and_fuse", "compile"])
def test_generate_beyond_greedy_matches_cpu(run):
    # tests/migration/hf_generate.py on the tpu device: beam search, a repetition penalty,
    # sampling (top_k, top_p, temperature) under torch.manual_seed, alone and on a left-padded
    # batch. Sampled tokens are CPU's too: the tpu generator is a CPU generator seeded alike.
    # Then, on Llama and GPT-2, the output dicts, assisted and prompt lookup decoding, the
    # logits processors and sampling filters of MORE_MODES, and bf16 weights.
    want, got = _cpu_and_device_runs("hf_generate", run)
    assert got["tokens"] == want["tokens"]
    assert got["eager_fallbacks"] == 0 and got["graph_breaks"] == {}
    # return_dict_in_generate=True: the same fields, shapes and dtypes, on the device (as on
    # CUDA), scores, logits, attentions and hidden states to float32 rounding at "highest".
    # The compiled run asks for no attentions or hidden states (transformers' hooks break
    # the graph, on the CPU too: docs/migration.md).
    layers = ("attentions", "hidden_states") if run == "compile" else ()
    assert got["outputs"].keys() == want["outputs"].keys() and len(want["outputs"]) == 10
    for key, fields in want["outputs"].items():
        fields = {name: f for name, f in fields.items() if name not in layers}
        assert got["outputs"][key].keys() == fields.keys(), key
        for name, field in fields.items():
            mine = got["outputs"][key][name]
            assert json.dumps(mine["structure"]) == \
                json.dumps(field["structure"]).replace('"cpu"', '"tpu:0"'), (key, name)
            assert mine["values"] == pytest.approx(field["values"], rel=1e-5, abs=1e-6), \
                (key, name)
    _assert_bf16_tokens_match(want["bf16"], got["bf16"])


def _assert_bf16_tokens_match(want: dict, got: dict):
    """Greedy bf16 tokens equal to CPU bf16's up to the first near tie: a step where CPU's two
    largest logits lie within 4 bf16 steps of the largest (each run rounds its bf16 matmuls
    its own way; the largest logits differed by 2 steps at most, 2026-12-04)."""
    for name, cpu in want.items():
        assert got[name]["weights"] == cpu["weights"] == "torch.bfloat16"
        prompt = len(cpu["tokens"][0]) - len(cpu["margins"])
        clear = 0
        for top, margin in zip(cpu["top"], cpu["margins"]):
            if margin <= 4 * 2.0 ** (math.floor(math.log2(abs(top))) - 7):
                break
            clear += 1
        assert clear >= 4, (name, cpu)  # the case still tests something
        assert got[name]["tokens"][0][:prompt + clear] == \
            cpu["tokens"][0][:prompt + clear], name


@pytest.mark.parametrize("run", ["strict", "defer_and_fuse", "compile"])
def test_encoder_decoder_generate_matches_cpu(run):
    # tests/migration/hf_generate_seq2seq.py on the tpu device: T5 (a right-padded batch) and
    # Whisper (log-mel features), greedy and beam search, each model in the same process (the
    # compiled run shares transformers' forward wrapper, and Dynamo's recompile budget, between
    # the two: the tokens stay CPU's either way).
    want, got = _cpu_and_device_runs("hf_generate_seq2seq", run)
    assert got["tokens"] == want["tokens"]
    assert got["eager_fallbacks"] == 0 and got["graph_breaks"] == {}


def test_without_the_accelerate_switch_the_batch_stays_on_the_cpu():
    # What ACCELERATE_TORCH_DEVICE is for (docs/migration.md): if accelerate learns the tpu
    # device on its own one day, this fails and the line can leave the guide.
    done = subprocess.run([sys.executable, "-m", "tests.migration.hf_trainer", "tpu"],
                          capture_output=True, text=True, timeout=900, env=python_env())
    assert done.returncode != 0 and "Expected all tensors to be on the same device" in done.stderr


def _assert_close(got, want, tolerance: float, where: str = "result"):
    """``got`` equals ``want`` (JSON) in structure, strings and ints; floats to ``tolerance``,
    relative and absolute."""
    if isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for key in want:
            _assert_close(got[key], want[key], tolerance, f"{where}[{key!r}]")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_close(g, w, tolerance, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=tolerance, abs=tolerance), where
    else:
        assert got == want, where


def test_pipelines_and_from_pretrained_match_cpu():
    # tests/migration/hf_pipelines.py: pipeline() for text generation (GPT-2, Llama; greedy,
    # sampled under a seed, a left-padded batch), fill-mask, text and token classification,
    # feature extraction and zero-shot, on checkpoints saved to a folder; from_pretrained with
    # device_map "tpu", {"": "tpu"} and a map offloading a layer to the CPU (which failed in its
    # first forward: accelerate rebuilds the parameter as type(p)(data, requires_grad=...)),
    # in float32, bfloat16 and dtype="auto"; save_pretrained of the device's model read back on
    # the CPU; a T5 beam search.
    want = _run_script("hf_pipelines", "cpu")
    got = _run_script("hf_pipelines", "tpu")
    assert got["eager_fallbacks"] == 0
    for name, run in got["pipelines"].items():
        assert (want["pipelines"][name]["device"], run["device"]) == ("cpu", "tpu:0"), name
        _assert_close(run["output"], want["pipelines"][name]["output"], 1e-4, name)
    loaded, cpu = got["loaded"], want["loaded"]
    assert {name: run["placed"] for name, run in loaded.items() if "placed" in run} == {
        "float32": ["tpu torch.float32"], "device_map dict": ["tpu torch.float32"],
        "bfloat16": ["tpu torch.bfloat16"], "dtype auto": ["tpu torch.float32"],
        # the offloaded layer's weights wait on "meta"; its hook brings them for its forward
        "offloaded": ["meta torch.float32", "tpu torch.float32"]}
    for name in ("float32", "device_map dict", "dtype auto", "offloaded", "bfloat16"):
        # bfloat16: within a step or two of bfloat16 (8 bits of mantissa) of CPU's logits
        _assert_close(loaded[name]["logits"], cpu[name]["logits"],
                      2e-2 if name == "bfloat16" else 1e-4, name)
        assert loaded[name]["tokens"] == cpu[name]["tokens"], name
    # save_pretrained of the model on the device writes what the CPU's writes, bit for bit
    assert loaded["saved"] == cpu["saved"]
    assert loaded["gpt2 generate"] == cpu["gpt2 generate"]
    assert loaded["t5 beams"] == cpu["t5 beams"]
