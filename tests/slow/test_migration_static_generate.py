"""generate() with a static cache on a tpu model, as a CUDA user writes it: transformers
compiles the decoding step itself, with ``backend="tpu"`` (tests/migration/llama_generate.py);
the tokens must be eager CPU's. Fresh processes, as the other migration scripts run."""
import json
import subprocess
import sys

import pytest

from tests.support import python_env

pytestmark = pytest.mark.slow


def _run(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.migration.llama_generate", *args],
                          capture_output=True, text=True, timeout=900, env=python_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_static_cache_generate_compiles_itself_on_tpu():
    want = _run("cpu", "static")
    got = _run("tpu", "static")
    assert (want["device"], got["device"]) == ("cpu", "tpu:0")
    assert want["frames_compiled"] == 0 and got["frames_compiled"] > 0  # transformers compiled
    assert got["tokens"] == want["tokens"] and len(got["tokens"][0]) == 8
    assert got["graph_breaks"] == {}


# Hugging Face's recipe with the default backend: the user compiles the forward, generates with
# the dynamic cache (lengths vary: the forward is bucketed), then with the static cache, whose
# lazily built counter moves to the model's device inside the bucketed graph.
USER_COMPILED = """
import json, torch
from transformers import LlamaConfig, LlamaForCausalLM
from torchtpu_compile import config
config.matmul_precision = "highest"
torch.set_float32_matmul_precision("highest")
cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
torch.manual_seed(0)
cpu = LlamaForCausalLM(cfg).eval()
model = LlamaForCausalLM(cfg).eval()
model.load_state_dict(cpu.state_dict())
model.to("tpu")
model.forward = torch.compile(model.forward)
ids = torch.randint(3, 128, (1, 6))
out = {}
with torch.no_grad():
    for cache in ("dynamic", "static"):
        kw = {"cache_implementation": "static"} if cache == "static" else {}
        want = cpu.generate(ids, max_new_tokens=6, do_sample=False, **kw)
        got = model.generate(ids.to("tpu"), max_new_tokens=6, do_sample=False, **kw)
        out[cache] = [got.device.type, got.cpu().tolist() == want.tolist()]
print(json.dumps(out))
"""


def test_user_compiled_forward_generates_with_both_caches_on_tpu():
    # The static cache after the dynamic one raised "found at least two devices, cpu and
    # tpu:0" in the bucketed graph's retrace (prims.device_put(counter, tpu)).
    done = subprocess.run([sys.executable, "-c", USER_COMPILED], capture_output=True,
                          text=True, timeout=900, env=python_env())
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"dynamic": ["tpu", True], "static": ["tpu", True]}, result
