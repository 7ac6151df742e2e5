"""Hugging Face ``generate()`` beyond greedy on a tiny random-init Llama, as a CUDA user runs it:
beam search, a repetition penalty, a left-padded batch with its attention mask, and sampling
with ``top_k``/``top_p``/``temperature`` under ``torch.manual_seed``.

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"
    -    model.compile()
    +    model.compile(backend="torchtpu")      # only for the compiled run

Sampled tokens are CPU's under the same seed, not just reproducible: tpu random ops draw on the
host from the tpu generator, a CPU generator that ``torch.manual_seed`` seeds too (CUDA's
Philox draws other numbers than the CPU's Mersenne Twister), so a script whose draws on each
device come in the same order samples CPU's tokens.

Beyond the tokens, on a tiny GPT-2 as well as the Llama (``MORE_MODES``): what
``return_dict_in_generate=True`` returns (scores, logits, attentions, hidden states: their
structure, dtypes, devices and values), assisted decoding with a smaller model on the device,
prompt lookup decoding, ``use_cache=False``, ``min_length``/``max_length``, forced BOS/EOS
tokens, suppressed tokens, ``sequence_bias``, ``renormalize_logits`` and the sampling filters
``epsilon_cutoff``, ``eta_cutoff``, ``typical_p``, ``min_p``; and greedy tokens of the models
loaded with ``torch_dtype=torch.bfloat16``, with CPU's top-2 logit margin at each step.
The compiled run asks for no attentions or hidden states: transformers collects them through
hooks it installs under a lock, where Dynamo breaks the graph (on the CPU too).

Run it: ``python -m tests.migration.hf_generate tpu [compile]`` (``TORCH_TPU_DEFER_AND_FUSE=1``
for defer-and-fuse); ``... cpu`` for the reference. Prints one JSON line.
"""
from __future__ import annotations

import json
import sys

import torch

MODES = {
    "greedy": dict(do_sample=False),
    "beams": dict(do_sample=False, num_beams=3, num_return_sequences=2),
    "repetition_penalty": dict(do_sample=False, repetition_penalty=1.5),
    "sampled": dict(do_sample=True, top_k=10, top_p=0.9, temperature=0.7),
}


_OUTPUTS = dict(return_dict_in_generate=True, output_scores=True, output_logits=True)
_LAYERS = dict(output_attentions=True, output_hidden_states=True)
MORE_MODES = {
    "outputs_greedy": dict(do_sample=False, **_OUTPUTS, **_LAYERS),
    "outputs_beams": dict(do_sample=False, num_beams=3, num_return_sequences=2, **_OUTPUTS,
                          **_LAYERS),
    "outputs_sampled": dict(do_sample=True, top_k=10, **_OUTPUTS, **_LAYERS),
    "assisted": dict(do_sample=False, assistant=True),
    "assisted_outputs": dict(do_sample=False, assistant=True, **_OUTPUTS),
    "prompt_lookup": dict(do_sample=False, prompt_lookup_num_tokens=3),
    "no_cache": dict(do_sample=False, use_cache=False),
    "min_max_length": dict(do_sample=False, min_length=10, max_length=10),
    "forced_bos_eos": dict(do_sample=False, forced_bos_token_id=3, forced_eos_token_id=4),
    "suppress": dict(do_sample=False, suppress_tokens=[5, 6, 7], begin_suppress_tokens=[8, 9]),
    "sequence_bias": dict(do_sample=False, sequence_bias={(5,): -10.0, (7, 8): 5.0}),
    "renormalize": dict(do_sample=True, top_k=10, renormalize_logits=True, **_OUTPUTS),
    "epsilon": dict(do_sample=True, epsilon_cutoff=0.018),
    "eta": dict(do_sample=True, eta_cutoff=0.9),
    "typical": dict(do_sample=True, typical_p=0.5),
    "min_p": dict(do_sample=True, min_p=0.9),
}


def _models() -> dict:
    """name: (model, a smaller one with its vocabulary: the assistant), random-init, float32."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    def llama(layers):
        return LlamaForCausalLM(LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            pad_token_id=0, bos_token_id=1, eos_token_id=2))

    def gpt2(layers):
        return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=layers, n_head=4,
                                          n_positions=64, bos_token_id=1, eos_token_id=2,
                                          pad_token_id=0))
    built = {}
    for name, make in (("llama", llama), ("gpt2", gpt2)):
        torch.manual_seed(0)
        model = make(2)
        torch.manual_seed(1)
        built[name] = (model, make(1))
    return built


def _flat(value) -> list:
    """The floats of a tensor or nested tuple of tensors, in order."""
    if isinstance(value, torch.Tensor):
        return value.detach().float().cpu().flatten().tolist()
    return [] if value is None else [x for v in value for x in _flat(v)]


def _structure(value):
    """Nested (shape, dtype, device) of a generate() output field."""
    if isinstance(value, torch.Tensor):
        return [list(value.shape), str(value.dtype), str(value.device)]
    return None if value is None else [_structure(v) for v in value]


def _summary(out) -> dict:
    """A GenerateOutput as JSON: each tensor field's structure and values. Not the cache:
    beam search's last step adds -1e9 to every candidate's log-probability (all stop), which
    float32 rounds to ties, and the running beams the cache is reordered by are a topk of
    those ties, whose order PyTorch leaves open (on tpu the last two positions differed, the
    sequences, scores and beam indices equal)."""
    fields = {key: value for key, value in out.items()
              if key not in ("sequences", "cache", "past_key_values") and value is not None}
    return {key: {"structure": _structure(value), "values": _flat(value)}
            for key, value in fields.items()}


def _more_modes(device: str, compiled: bool, models: dict) -> tuple[dict, dict]:
    """MORE_MODES on each model, on one prompt whose 3-grams repeat (prompt lookup finds
    candidates in it; assisted decoding takes a batch of one)."""
    tokens, outputs = {}, {}
    prompt = torch.tensor([[5, 6, 7, 8, 5, 6, 7]], device=device)
    for name, (model, assistant) in models.items():
        for mode, options in MORE_MODES.items():
            options = dict(options)
            if options.pop("assistant", False):
                options["assistant_model"] = assistant
            if compiled:
                options = {k: v for k, v in options.items() if k not in _LAYERS}
            if "max_length" not in options:
                options.update(max_new_tokens=6, min_new_tokens=6)
            # Attentions come from the eager attention only (sdpa returns none, on CUDA too).
            model.set_attn_implementation("eager" if options.get("output_attentions")
                                          else "sdpa")
            torch.manual_seed(42)
            out = model.generate(prompt, **options)
            key = f"{name} {mode}"
            if isinstance(out, torch.Tensor):
                tokens[key] = out.cpu().tolist()
            else:
                tokens[key] = out.sequences.cpu().tolist()
                outputs[key] = _summary(out)
        model.set_attn_implementation("sdpa")
    return tokens, outputs


def _bf16(device: str, compiled: bool, models: dict) -> dict:
    """Greedy tokens of each model saved and loaded back with ``torch_dtype=torch.bfloat16``,
    and the margin between the two largest logits at each step."""
    import tempfile

    results = {}
    for name, (model, _) in models.items():
        with tempfile.TemporaryDirectory() as path:
            model.save_pretrained(path)
            low = type(model).from_pretrained(path, torch_dtype=torch.bfloat16)
        low = low.to(device).eval()
        if compiled:
            low.compile(backend="torchtpu")
        out = low.generate(torch.tensor([[3, 9, 27, 17, 40]], device=device), do_sample=False,
                           max_new_tokens=8, min_new_tokens=8, return_dict_in_generate=True,
                           output_logits=True)
        top = torch.stack(out.logits, 1)[0].float().cpu().topk(2, -1).values
        results[name] = {"tokens": out.sequences.cpu().tolist(),
                         "weights": str(next(low.parameters()).dtype),
                         "top": top[:, 0].tolist(), "margins": (top[:, 0] - top[:, 1]).tolist()}
    return results


def main(device: str, compiled: bool = False) -> dict:
    torch.set_float32_matmul_precision("highest")
    models = _models()
    for pair in models.values():
        for m in pair:
            m.to(device).eval()
            if compiled:
                m.compile(backend="torchtpu")
    model = models["llama"][0]
    prompts = {"one": dict(input_ids=torch.tensor([[5, 6, 7, 8]], device=device)),
               "left_padded": dict(input_ids=torch.tensor([[0, 0, 5, 6], [9, 10, 11, 12]],
                                                          device=device),
                                   attention_mask=torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]],
                                                               device=device))}
    tokens = {}
    with torch.no_grad():
        for prompt, inputs in prompts.items():
            for mode, options in MODES.items():
                torch.manual_seed(42)
                out = model.generate(**inputs, **options, max_new_tokens=6, min_new_tokens=6)
                tokens[f"{prompt} {mode}"] = out.cpu().tolist()
        more_tokens, outputs = _more_modes(device, compiled, models)
        bf16 = _bf16(device, compiled, models)
    from torchtpu_compile import stats
    return {"device": str(out.device), "tokens": {**tokens, **more_tokens}, "outputs": outputs,
            "bf16": bf16,
            "eager_fallbacks": stats()["eager_fallbacks"],
            "graph_breaks": dict(stats()["graph_breaks"])}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], compiled="compile" in sys.argv[2:])))
