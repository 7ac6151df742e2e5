"""Sequence-to-sequence translation with a GRU encoder and an attention decoder, in the shape of
PyTorch's "NLP from scratch: translation" tutorial (its sentence-at-a-time form), on a synthetic
language: the target is the source reversed, every word shifted by one.

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"

What it exercises: an encoder stepped one word at a time (``nn.Embedding``, ``nn.GRU``) whose
outputs are written into a preallocated tensor (``encoder_outputs[i] = ...``), an attention
decoder (attention weights from the embedded word and the hidden state, ``bmm`` with the encoder
outputs, dropout, ``log_softmax``), teacher forcing chosen per sentence by ``random.random()``,
otherwise the decoder's own ``topk(1)`` guess fed back with ``detach()`` and an ``.item()`` check
for the end-of-sentence token that ends the loop, ``NLLLoss`` summed over the words, one
optimizer for the encoder and one for the decoder (SGD as in the tutorial, or Adam), and greedy
evaluation that collects the attention matrix. Sentences differ in length, so each has its own
number of steps. ``main(device)`` runs it and returns what tests/migration/test_scripts.py
compares against the same script on CPU.

Run it alone: ``python -m tests.migration.seq2seq_attention tpu``.
"""
from __future__ import annotations

import random
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

SOS, EOS = 0, 1
VOCAB = 12
MAX_LENGTH = 6


class Encoder(nn.Module):
    def __init__(self, vocab, hidden):
        super().__init__()
        self.hidden = hidden
        self.embedding = nn.Embedding(vocab, hidden)
        self.gru = nn.GRU(hidden, hidden)

    def forward(self, word, hidden):
        return self.gru(self.embedding(word).view(1, 1, -1), hidden)

    def init_hidden(self, device):
        return torch.zeros(1, 1, self.hidden, device=device)


class AttentionDecoder(nn.Module):
    def __init__(self, hidden, vocab, dropout=0.1, max_length=MAX_LENGTH):
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.attn = nn.Linear(2 * hidden, max_length)
        self.combine = nn.Linear(2 * hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.gru = nn.GRU(hidden, hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, word, hidden, encoder_outputs):
        embedded = self.dropout(self.embedding(word).view(1, 1, -1))
        weights = F.softmax(self.attn(torch.cat((embedded[0], hidden[0]), 1)), dim=1)
        applied = torch.bmm(weights.unsqueeze(0), encoder_outputs.unsqueeze(0))
        output = F.relu(self.combine(torch.cat((embedded[0], applied[0]), 1)).unsqueeze(0))
        output, hidden = self.gru(output, hidden)
        return F.log_softmax(self.out(output[0]), dim=1), hidden, weights


def encode(encoder, sentence, device):
    hidden = encoder.init_hidden(device)
    outputs = torch.zeros(MAX_LENGTH, encoder.hidden, device=device)
    for i in range(sentence.size(0)):
        output, hidden = encoder(sentence[i], hidden)
        outputs[i] = output[0, 0]
    return outputs, hidden


def train_pair(source, target, encoder, decoder, optimizers, criterion, device,
               teacher_forcing=0.5):
    for optimizer in optimizers:
        optimizer.zero_grad()
    encoder_outputs, hidden = encode(encoder, source, device)
    word = torch.tensor([[SOS]], device=device)
    loss = 0
    if random.random() < teacher_forcing:
        for i in range(target.size(0)):
            output, hidden, _ = decoder(word, hidden, encoder_outputs)
            loss += criterion(output, target[i])
            word = target[i]
    else:
        for i in range(target.size(0)):
            output, hidden, _ = decoder(word, hidden, encoder_outputs)
            _, top = output.topk(1)
            word = top.squeeze().detach()
            loss += criterion(output, target[i])
            if word.item() == EOS:
                break
    loss.backward()
    for optimizer in optimizers:
        optimizer.step()
    return loss.item() / target.size(0)


def evaluate(encoder, decoder, sentence, device):
    """Greedy decoding of one sentence, stopping at EOS: the words and the attention matrix."""
    with torch.no_grad():
        encoder_outputs, hidden = encode(encoder, sentence.to(device), device)
        word = torch.tensor([[SOS]], device=device)
        words = []
        attentions = torch.zeros(MAX_LENGTH, MAX_LENGTH)
        for i in range(MAX_LENGTH):
            output, hidden, weights = decoder(word, hidden, encoder_outputs)
            attentions[i] = weights.data.cpu()
            _, top = output.data.topk(1)
            if top.item() == EOS:
                break
            words.append(top.item())
            word = top.squeeze().detach()
    return words, attentions[:i + 1]


def make_pairs(n):
    """(source, target) word-index columns of random lengths, each ending in EOS."""
    g = torch.Generator().manual_seed(1)
    pairs = []
    for _ in range(n):
        length = int(torch.randint(1, MAX_LENGTH - 1, (1,), generator=g))
        words = torch.randint(2, VOCAB - 1, (length,), generator=g)
        eos = torch.tensor([EOS])
        pairs.append((torch.cat([words, eos]).view(-1, 1),
                      torch.cat([words.flip(0) + 1, eos]).view(-1, 1)))
    return pairs


def main(device: str = "cuda", iterations: int = 12, optimizer: str = "sgd",
         hidden: int = 16) -> dict:
    torch.manual_seed(0)
    random.seed(0)
    encoder = Encoder(VOCAB, hidden).to(device)
    decoder = AttentionDecoder(hidden, VOCAB).to(device)
    make_optimizer = {"sgd": lambda p: torch.optim.SGD(p, lr=0.05),
                      "adam": lambda p: torch.optim.Adam(p, lr=1e-2)}[optimizer]
    optimizers = [make_optimizer(encoder.parameters()), make_optimizer(decoder.parameters())]
    criterion = nn.NLLLoss()
    pairs = make_pairs(iterations)
    # Dropout draws from the device's generator, which initialization (on the host) did not
    # advance: seeding again makes the CPU and device runs draw the same masks.
    torch.manual_seed(0)

    losses = [train_pair(source.to(device), target.to(device), encoder, decoder, optimizers,
                         criterion, device) for source, target in pairs]
    encoder.eval()
    decoder.eval()
    translations = [evaluate(encoder, decoder, source, device) for source, _ in pairs[:3]]
    return {
        "losses": losses,
        "translations": [words for words, _ in translations],
        "attentions": [attention for _, attention in translations],
        "encoder": {k: v.cpu() for k, v in encoder.state_dict().items()},
        "decoder": {k: v.cpu() for k, v in decoder.state_dict().items()},
        "decoder_optimizer": [{k: v.cpu() if isinstance(v, torch.Tensor) else v
                               for k, v in state.items()}
                              for state in optimizers[1].state.values()],
    }


if __name__ == "__main__":
    result = main(*sys.argv[1:2])
    print(result["losses"], result["translations"])
