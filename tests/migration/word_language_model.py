"""A word-level language model, in the shape of pytorch/examples' word_language_model, on a
made-up corpus (no dataset).

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"

What it exercises: a corpus batchified with ``narrow`` and ``view(...).t().contiguous()``,
``get_batch`` slices, an ``nn.LSTM`` (2 layers, dropout between them) or an
``nn.TransformerEncoder`` with sinusoidal positions and
``nn.Transformer.generate_square_subsequent_mask``, encoder and decoder weights tied,
``log_softmax`` + ``NLLLoss``, hidden state repackaged with ``detach`` between batches,
``clip_grad_norm_``, the manual SGD update ``p.data.add_(p.grad, alpha=-lr)``, evaluation under
``no_grad`` with perplexity ``math.exp``, the learning rate annealed by 4 when validation does
not improve, then text generated one word at a time with ``torch.multinomial`` on
``logits.div(temperature).exp()`` and ``fill_`` of the next input. ``main(device, model_type)``
runs it and returns what tests/migration/test_scripts.py compares against the same script on CPU.

Run it alone: ``python -m tests.migration.word_language_model tpu LSTM``.
"""
from __future__ import annotations

import math
import random
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.2, tie_weights=True):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            self.decoder.weight = self.encoder.weight
        self.nhid, self.nlayers = nhid, nlayers
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.decoder.out_features)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.1, max_len=64):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0).transpose(0, 1))

    def forward(self, x):
        return self.dropout(x + self.pe[:x.size(0), :])


class TransformerModel(nn.Module):
    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.2):
        super().__init__()
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        layer = nn.TransformerEncoderLayer(ninp, nhead, nhid, dropout)
        self.encoder = nn.TransformerEncoder(layer, nlayers, enable_nested_tensor=False)
        self.input_emb = nn.Embedding(ntoken, ninp)
        self.decoder = nn.Linear(ninp, ntoken)
        self.ninp = ninp
        nn.init.uniform_(self.input_emb.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, src, has_mask=True):
        mask = None
        if has_mask:
            mask = nn.Transformer.generate_square_subsequent_mask(len(src)).to(src.device)
        src = self.pos_encoder(self.input_emb(src) * math.sqrt(self.ninp))
        output = self.decoder(self.encoder(src, mask=mask))
        return F.log_softmax(output, dim=-1)


def repackage_hidden(h):
    """Detach hidden states from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def make_corpus(words=400, vocab=30, seed=0):
    rng = random.Random(seed)
    # a Markov chain so that there is something to learn
    nxt = {w: [rng.randrange(vocab) for _ in range(3)] for w in range(vocab)}
    ids, w = [], 0
    for _ in range(words):
        ids.append(w)
        w = rng.choice(nxt[w])
    return torch.tensor(ids, dtype=torch.long)


def batchify(data, bsz, device):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous().to(device)


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].view(-1)


def main(device: str = "cuda", model_type: str = "LSTM", epochs: int = 2, bptt: int = 8,
         words: int = 10, vocab: int = 30) -> dict:
    torch.manual_seed(0)
    corpus = make_corpus(vocab=vocab)
    train_data = batchify(corpus[:300], 4, device)
    val_data = batchify(corpus[300:], 2, device)
    if model_type == "Transformer":
        model = TransformerModel(vocab, 16, 2, 32, 2).to(device)
    else:
        model = RNNModel(vocab, 16, 16, 2).to(device)
    torch.manual_seed(0)   # the device's generator too: dropout draws the CPU run's masks
    criterion = nn.NLLLoss()
    lr, clip = 5.0, 0.25

    def evaluate(data_source, bsz):
        model.eval()
        total_loss = 0.
        if model_type != "Transformer":
            hidden = model.init_hidden(bsz)
        with torch.no_grad():
            for i in range(0, data_source.size(0) - 1, bptt):
                data, targets = get_batch(data_source, i, bptt)
                if model_type == "Transformer":
                    output = model(data).view(-1, vocab)
                else:
                    output, hidden = model(data, hidden)
                    hidden = repackage_hidden(hidden)
                total_loss += len(data) * criterion(output, targets).item()
        return total_loss / (len(data_source) - 1)

    train_losses, val_losses, lrs = [], [], []
    best_val_loss = None
    for _epoch in range(epochs):
        model.train()
        if model_type != "Transformer":
            hidden = model.init_hidden(4)
        for i in range(0, train_data.size(0) - 1, bptt):
            data, targets = get_batch(train_data, i, bptt)
            model.zero_grad()
            if model_type == "Transformer":
                output = model(data).view(-1, vocab)
            else:
                hidden = repackage_hidden(hidden)
                output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            train_losses.append(loss.item())
        val_loss = evaluate(val_data, 2)
        val_losses.append((val_loss, math.exp(val_loss)))
        if not best_val_loss or val_loss < best_val_loss:
            best_val_loss = val_loss
        else:
            lr /= 4.0
        lrs.append(lr)

    # generate.py: sample words one at a time
    model.eval()
    temperature = 0.8
    # drawn on the device (as the multinomials below): a host draw would come from the
    # host's generator, which the CPU run shares with its dropout and this run does not
    input = torch.randint(vocab, (1, 1), dtype=torch.long, device=device)
    if model_type != "Transformer":
        hidden = model.init_hidden(1)
    generated = []
    with torch.no_grad():
        for _ in range(words):
            if model_type == "Transformer":
                output = model(input, False)
                word_weights = output[-1].squeeze().div(temperature).exp()
                word_idx = torch.multinomial(word_weights, 1)[0]
                word_tensor = word_idx.view(1, 1)
                input = torch.cat([input, word_tensor], 0)
            else:
                output, hidden = model(input, hidden)
                word_weights = output.squeeze().div(temperature).exp()
                word_idx = torch.multinomial(word_weights, 1)[0]
                input.fill_(word_idx)
            generated.append(int(word_idx))
    return {"train_losses": train_losses, "val_losses": val_losses, "lrs": lrs,
            "generated": generated,
            "model": {k: v.cpu() for k, v in model.state_dict().items()}}


if __name__ == "__main__":
    result = main(*sys.argv[1:3])
    print(result["train_losses"], result["val_losses"], result["generated"])
