"""Classifying names with a character-level RNN, in the shape of PyTorch's "NLP from scratch:
classifying names" tutorial, on made-up names of made-up languages (no dataset).

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"

What it exercises: one-hot letter tensors built on the device by index assignment
(``tensor[i][0][index] = 1``), an ``nn.RNN`` stepped one character at a time with its hidden
state passed back in, ``nn.LogSoftmax`` with ``NLLLoss`` summed over a minibatch of names of
different lengths, ``clip_grad_norm_``, SGD, and prediction with ``topk(1)`` and ``.item()``.
``main(device)`` runs it and returns what tests/migration/test_scripts.py compares against the
same script on CPU.

Run it alone: ``python -m tests.migration.char_rnn tpu``.
"""
from __future__ import annotations

import random
import string
import sys

import torch
import torch.nn as nn

LETTERS = string.ascii_letters + " .,;'"
LANGUAGES = {"Vowelian": "aeiouy", "Consonish": "bcdfgklmnprst", "Zedic": "qxzjvw"}


def line_to_tensor(line, device):
    tensor = torch.zeros(len(line), 1, len(LETTERS), device=device)
    for i, letter in enumerate(line):
        tensor[i][0][LETTERS.find(letter)] = 1
    return tensor


class CharRNN(nn.Module):
    def __init__(self, letters, hidden, languages):
        super().__init__()
        self.hidden_size = hidden
        self.rnn = nn.RNN(letters, hidden)
        self.h2o = nn.Linear(hidden, languages)
        self.softmax = nn.LogSoftmax(dim=1)

    def forward(self, letter, hidden):
        output, hidden = self.rnn(letter, hidden)
        return self.softmax(self.h2o(output[0])), hidden

    def init_hidden(self, device):
        return torch.zeros(1, 1, self.hidden_size, device=device)


def classify(rnn, line_tensor, device):
    hidden = rnn.init_hidden(device)
    for i in range(line_tensor.size(0)):
        output, hidden = rnn(line_tensor[i].unsqueeze(0), hidden)
    return output


def make_names(n, rng):
    names = []
    for _ in range(n):
        language = rng.choice(sorted(LANGUAGES))
        letters = LANGUAGES[language] + "aen"   # some letters shared by every language
        name = "".join(rng.choice(letters) for _ in range(rng.randint(2, 6))).capitalize()
        names.append((name, language))
    return names


def main(device: str = "cuda", batches: int = 4, batch_size: int = 4, hidden: int = 16) -> dict:
    torch.manual_seed(0)
    rng = random.Random(0)
    languages = sorted(LANGUAGES)
    rnn = CharRNN(len(LETTERS), hidden, len(languages)).to(device)
    criterion = nn.NLLLoss()
    optimizer = torch.optim.SGD(rnn.parameters(), lr=0.1)
    names = make_names(batches * batch_size + 4, rng)

    rnn.train()
    losses = []
    for b in range(batches):
        optimizer.zero_grad()
        batch_loss = 0
        for name, language in names[b * batch_size:(b + 1) * batch_size]:
            label = torch.tensor([languages.index(language)], dtype=torch.long, device=device)
            output = classify(rnn, line_to_tensor(name, device), device)
            batch_loss = batch_loss + criterion(output, label)
        batch_loss.backward()
        nn.utils.clip_grad_norm_(rnn.parameters(), 3)
        optimizer.step()
        losses.append(batch_loss.item() / batch_size)

    rnn.eval()
    guesses, scores = [], []
    with torch.no_grad():
        for name, _ in names[-4:]:
            output = classify(rnn, line_to_tensor(name, device), device)
            _, top = output.topk(1)
            guesses.append(languages[top[0].item()])
            scores.append(output.cpu())
    return {"losses": losses, "guesses": guesses, "scores": scores,
            "model": {k: v.cpu() for k, v in rnn.state_dict().items()}}


if __name__ == "__main__":
    result = main(*sys.argv[1:2])
    print(result["losses"], result["guesses"])
