"""Hugging Face task heads (regression, question answering, multiple choice, sequence and
token classification, double heads), tiny and without dropout, with the labels each one's
own loss takes: code we did not write, trained at many shapes by
``tests/slow/test_buckets_full.py``.

Example::

    model, inputs = HEADS["bert_qa"]()
    model(**inputs(2, 9)).loss
"""
from __future__ import annotations

import torch
import transformers as T

_BERT = dict(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
             intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
             attention_probs_dropout_prob=0.0)
_GPT2 = dict(vocab_size=100, n_embd=32, n_layer=1, n_head=2, n_positions=128, pad_token_id=0,
             bos_token_id=1, eos_token_id=2,
             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0)
_LLAMA = dict(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
              pad_token_id=0)
_BART = dict(vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1,
             encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
             decoder_ffn_dim=64, max_position_embeddings=128, eos_token_id=2, pad_token_id=1,
             bos_token_id=0, decoder_start_token_id=2, dropout=0.0, attention_dropout=0.0,
             activation_dropout=0.0, classifier_dropout=0.0)
_T5 = dict(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2,
           eos_token_id=1, pad_token_id=0, decoder_start_token_id=0, dropout_rate=0.0,
           classifier_dropout=0.0)


def _ids(b, s):
    return torch.randint(3, 90, (b, s))


def _classes(b, s):
    return dict(input_ids=_ids(b, s), labels=torch.randint(0, 3, (b,)))


def _ending_in(eos):
    def inputs(b, s):
        ids = _ids(b, s)
        ids[:, -1] = eos  # one end of sequence per row, as the pooling requires
        return dict(input_ids=ids, labels=torch.randint(0, 3, (b,)))
    return inputs


def _spans(b, s):
    # some positions past the end: the loss clamps them to the length and ignores those
    return dict(input_ids=_ids(b, s), start_positions=torch.randint(0, s + 3, (b,)),
                end_positions=torch.randint(0, s, (b,)))


def _choices(b, s):
    return dict(input_ids=torch.randint(3, 90, (b, 2, s)), labels=torch.randint(0, 2, (b,)))


def _double_heads(b, s):
    return dict(input_ids=torch.randint(3, 90, (b, 2, s)),
                mc_token_ids=torch.randint(0, s, (b, 2)),
                labels=torch.randint(3, 90, (b, 2, s)), mc_labels=torch.randint(0, 2, (b,)))


HEADS = {
    "bert_regression": lambda: (T.BertForSequenceClassification(
        T.BertConfig(num_labels=1, **_BERT)),
        lambda b, s: dict(input_ids=_ids(b, s), labels=torch.randn(b))),
    "bert_question_answering": lambda: (T.BertForQuestionAnswering(T.BertConfig(**_BERT)),
                                        _spans),
    "bert_multiple_choice": lambda: (T.BertForMultipleChoice(T.BertConfig(**_BERT)), _choices),
    "bert_token_classification": lambda: (T.BertForTokenClassification(
        T.BertConfig(num_labels=3, **_BERT)),
        lambda b, s: dict(input_ids=_ids(b, s), labels=torch.randint(0, 3, (b, s)))),
    "gpt2_sequence_classification": lambda: (T.GPT2ForSequenceClassification(
        T.GPT2Config(num_labels=3, **_GPT2)), _classes),
    "gpt2_double_heads": lambda: (T.GPT2DoubleHeadsModel(T.GPT2Config(**_GPT2)),
                                  _double_heads),
    "llama_sequence_classification": lambda: (T.LlamaForSequenceClassification(
        T.LlamaConfig(num_labels=3, **_LLAMA)), _classes),
    "bart_sequence_classification": lambda: (T.BartForSequenceClassification(
        T.BartConfig(num_labels=3, **_BART)), _ending_in(2)),
    "t5_sequence_classification": lambda: (T.T5ForSequenceClassification(
        T.T5Config(num_labels=3, **_T5)), _ending_in(1)),
}
