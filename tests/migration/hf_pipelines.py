"""Hugging Face as its users call it: ``pipeline()``, ``from_pretrained(device_map=...,
dtype=...)``, a device map that offloads to the CPU, ``save_pretrained`` and back, on tiny
random-init checkpoints saved to a folder with a word-level tokenizer built here (no network).

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"
    -    device_map = {..., "model.layers.1": "cpu", ...: 0}
    +    device_map = {..., "model.layers.1": "cpu", ...: "tpu"}

``pipeline(task, model=path)`` with no ``device`` (or ``device=0``) puts the model on CUDA on a
GPU machine but on the CPU here: transformers maps an index through a fixed list of device
types, so the script names its device, as most do (docs/migration.md).

Run it: ``python -m tests.migration.hf_pipelines tpu`` (``... cpu`` for the reference). Prints
one JSON line: each pipeline's output, each loaded model's (device, dtype) set and logits.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

import torch

WORDS = ("hello world the a cat dog sat on mat is good bad happy sad paris france capital of"
         .split())
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<s>", "</s>"]
VOCAB = len(SPECIAL) + len(WORDS)
LABELS = {0: "contradiction", 1: "neutral", 2: "entailment"}   # zero-shot reads these names
#: The CPU-offloading device map, CUDA's ``0`` written ``"tpu"`` (both work here).
OFFLOADED = {"model.embed_tokens": "tpu", "model.layers.0": "tpu", "model.layers.1": "cpu",
             "model.norm": "tpu", "model.rotary_emb": "tpu", "lm_head": "tpu"}


def _tokenizer(bert: bool):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(SPECIAL + WORDS)},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    special = dict(unk_token="[UNK]", pad_token="[PAD]")
    if bert:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
            special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
        special.update(cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    else:
        special.update(bos_token="<s>", eos_token="</s>")
    return PreTrainedTokenizerFast(tokenizer_object=tok, **special)


def _checkpoints(root: str) -> dict:
    """name: a folder holding a random-init model (seeded: the same in every process) and its
    tokenizer, as ``save_pretrained`` writes them."""
    import transformers as T
    bert = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=64, max_position_embeddings=64, pad_token_id=0)
    made = {
        "gpt2": (lambda: T.GPT2LMHeadModel(T.GPT2Config(
            vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=5,
            eos_token_id=6, pad_token_id=0)), False),
        "llama": (lambda: T.LlamaForCausalLM(T.LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            bos_token_id=5, eos_token_id=6, pad_token_id=0)), False),
        "bert_mlm": (lambda: T.BertForMaskedLM(T.BertConfig(**bert)), True),
        "bert_seq": (lambda: T.BertForSequenceClassification(T.BertConfig(
            **bert, id2label=LABELS, label2id={v: k for k, v in LABELS.items()})), True),
        "distilbert_tok": (lambda: T.DistilBertForTokenClassification(T.DistilBertConfig(
            vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
            max_position_embeddings=64, pad_token_id=0, num_labels=3)), True),
        "t5": (lambda: T.T5ForConditionalGeneration(T.T5Config(
            vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            decoder_start_token_id=0, pad_token_id=0, eos_token_id=6)), False),
    }
    paths = {}
    for name, (make, bert_tokens) in made.items():
        torch.manual_seed(0)
        paths[name] = os.path.join(root, name)
        make().save_pretrained(paths[name])
        _tokenizer(bert_tokens).save_pretrained(paths[name])
    return paths


def _plain(value):
    """A pipeline's output as JSON: numpy and torch numbers as floats, tensors as lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.float().tolist()
    if hasattr(value, "tolist"):   # numpy scalars and arrays
        return value.tolist()
    return value


def _pipelines(paths: dict, device: str) -> dict:
    from transformers import pipeline
    calls = {
        "gpt2 greedy": ("text-generation", "gpt2", "hello world the",
                        dict(max_new_tokens=8, do_sample=False)),
        "llama greedy": ("text-generation", "llama", "hello world the",
                         dict(max_new_tokens=8, do_sample=False)),
        "llama sampled": ("text-generation", "llama", "hello world",
                          dict(max_new_tokens=6, do_sample=True, top_k=5)),
        "gpt2 batched": ("text-generation", "gpt2", ["hello world the", "cat", "the dog sat"],
                         dict(batch_size=2, max_new_tokens=5, do_sample=False)),
        "fill-mask": ("fill-mask", "bert_mlm", "the cat [MASK] on the mat", dict(top_k=3)),
        "text-classification": ("text-classification", "bert_seq",
                                ["the cat is happy", "bad", "dog sat on mat"],
                                dict(top_k=None, batch_size=2)),
        "token-classification": ("token-classification", "distilbert_tok",
                                 "the cat sat on the mat", dict(aggregation_strategy="simple")),
        "feature-extraction": ("feature-extraction", "bert_mlm", "the cat sat", {}),
        "zero-shot": ("zero-shot-classification", "bert_seq", "the cat is happy",
                      dict(candidate_labels=["good", "bad"])),
    }
    out = {}
    for name, (task, model, inputs, options) in calls.items():
        pipe = pipeline(task, model=paths[model], device=device)
        if name == "gpt2 batched":
            pipe.tokenizer.padding_side = "left"
        torch.manual_seed(0)
        out[name] = {"device": str(pipe.model.device), "output": _plain(pipe(inputs, **options))}
    return out


def _loaded(paths: dict, device: str) -> dict:
    """from_pretrained's placements and logits; generate() of a tokenized prompt moved with
    ``.to(device)``; a T5 beam search; save_pretrained of the loaded model, read back on CPU."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer
    ids = torch.tensor([[7, 8, 9, 10, 11]])
    loads = {"float32": dict(device_map=device),
             "device_map dict": dict(device_map={"": device}),
             "bfloat16": dict(device_map=device, dtype=torch.bfloat16),
             "dtype auto": dict(device_map=device, dtype="auto"),
             # CPU offload: the CPU layer's weights come to the device for its forward only.
             "offloaded": dict(device_map=OFFLOADED if device == "tpu" else
                               {k: "cpu" for k in OFFLOADED})}
    out = {}
    with torch.no_grad():
        for name, options in loads.items():
            model = AutoModelForCausalLM.from_pretrained(paths["llama"], **options)
            placed = sorted({f"{p.device.type} {p.dtype}" for p in model.parameters()})
            out[name] = {"placed": placed,
                         "logits": model(ids.to(device)).logits.float().cpu().tolist(),
                         "tokens": model.generate(ids.to(device), max_new_tokens=5,
                                                  do_sample=False).cpu().tolist()}
        tok = AutoTokenizer.from_pretrained(paths["gpt2"])
        model = AutoModelForCausalLM.from_pretrained(paths["gpt2"], device_map=device)
        inputs = tok(["hello world the", "cat sat"], return_tensors="pt", padding=True)
        out["gpt2 generate"] = model.generate(**inputs.to(device), max_new_tokens=5,
                                              do_sample=False).cpu().tolist()
        with tempfile.TemporaryDirectory() as saved:
            model.save_pretrained(saved)
            back = AutoModelForCausalLM.from_pretrained(saved)   # on the CPU
            out["saved"] = {k: v.tolist() for k, v in back.state_dict().items()}
        t5_tok = AutoTokenizer.from_pretrained(paths["t5"])
        t5 = AutoModelForSeq2SeqLM.from_pretrained(paths["t5"], device_map=device)
        inputs = t5_tok(["the cat sat on", "dog"], return_tensors="pt", padding=True)
        out["t5 beams"] = t5.generate(**inputs.to(device), max_new_tokens=6,
                                      num_beams=2).cpu().tolist()
    return out


def main(device: str) -> dict:
    torch.set_float32_matmul_precision("highest")
    with tempfile.TemporaryDirectory() as root:
        paths = _checkpoints(root)
        pipelines = _pipelines(paths, device)
        loaded = _loaded(paths, device)
    from torchtpu_compile import stats
    return {"device": device, "pipelines": pipelines, "loaded": loaded,
            "eager_fallbacks": stats()["eager_fallbacks"]}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
