"""A graph convolutional network (Kipf & Welling), in the shape of the GCN examples written
for PyTorch, on a random graph with random features (no dataset).

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"
    -    adj = adj.to(device)                     # a sparse COO adjacency
    +    adj = adj.to_dense().to(device)          # the tpu device holds dense tensors only

What it exercises: a symmetric-normalized adjacency ``D^-1/2 (A + I) D^-1/2`` built with
``torch.sparse_coo_tensor`` from an edge list (``coalesce``, ``torch.sparse.sum``), graph
convolutions ``adj @ (x @ W)`` through ``torch.sparse.mm`` (sparse) or ``torch.mm`` (dense),
``nn.Parameter`` weights initialized with ``uniform_``, ``F.dropout``, ``log_softmax`` +
``F.nll_loss`` on the training nodes picked by an index tensor, ``Adam(weight_decay=5e-4)``,
and accuracy by ``max(1)[1].eq(...).sum()``. ``main(device, sparse)`` runs it and returns what
tests/migration/test_scripts.py compares against the same script on CPU; the tpu device
refuses sparse tensors (``sparse=True`` there raises, naming ``.to_dense()``).

Run it alone: ``python -m tests.migration.gcn tpu``.
"""
from __future__ import annotations

import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class GraphConvolution(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        stdv = 1. / math.sqrt(out_features)
        self.weight.data.uniform_(-stdv, stdv)
        self.bias.data.uniform_(-stdv, stdv)

    def forward(self, input, adj):
        support = torch.mm(input, self.weight)
        output = torch.sparse.mm(adj, support) if adj.is_sparse else torch.mm(adj, support)
        return output + self.bias


class GCN(nn.Module):
    def __init__(self, nfeat, nhid, nclass, dropout):
        super().__init__()
        self.gc1 = GraphConvolution(nfeat, nhid)
        self.gc2 = GraphConvolution(nhid, nclass)
        self.dropout = dropout

    def forward(self, x, adj):
        x = F.relu(self.gc1(x, adj))
        x = F.dropout(x, self.dropout, training=self.training)
        return F.log_softmax(self.gc2(x, adj), dim=1)


def normalized_adjacency(edges, n):
    """``D^-1/2 (A + I) D^-1/2`` as a sparse COO tensor."""
    loops = torch.arange(n).repeat(2, 1)
    index = torch.cat([edges, edges.flip(0), loops], dim=1)
    adj = torch.sparse_coo_tensor(index, torch.ones(index.size(1)), (n, n)).coalesce()
    adj = torch.sparse_coo_tensor(adj.indices(), torch.ones_like(adj.values()), (n, n)).coalesce()
    degree = torch.sparse.sum(adj, dim=1).to_dense()
    d_inv_sqrt = degree.pow(-0.5)
    row, col = adj.indices()
    values = d_inv_sqrt[row] * adj.values() * d_inv_sqrt[col]
    return torch.sparse_coo_tensor(adj.indices(), values, (n, n)).coalesce()


def accuracy(output, labels):
    preds = output.max(1)[1].type_as(labels)
    return preds.eq(labels).double().sum().item() / len(labels)


def main(device: str = "cuda", sparse: bool = False, epochs: int = 4, nodes: int = 24,
         features: int = 10, classes: int = 3) -> dict:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    labels = torch.randint(classes, (nodes,), generator=g)
    features_ = torch.randn(nodes, features, generator=g) + labels[:, None].float()
    edges = torch.randint(nodes, (2, 3 * nodes), generator=g)
    adj = normalized_adjacency(edges, nodes)
    idx_train, idx_test = torch.arange(nodes // 2), torch.arange(nodes // 2, nodes)

    model = GCN(features, 8, classes, dropout=0.5).to(device)
    torch.manual_seed(0)   # the device's generator too: dropout draws the CPU run's masks
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    x, labels = features_.to(device), labels.to(device)
    idx_train, idx_test = idx_train.to(device), idx_test.to(device)
    adj = adj.to(device) if sparse else adj.to_dense().to(device)

    losses, train_acc = [], []
    for _epoch in range(epochs):
        model.train()
        optimizer.zero_grad()
        output = model(x, adj)
        loss_train = F.nll_loss(output[idx_train], labels[idx_train])
        train_acc.append(accuracy(output[idx_train], labels[idx_train]))
        loss_train.backward()
        optimizer.step()
        losses.append(loss_train.item())

    model.eval()
    output = model(x, adj)
    loss_test = F.nll_loss(output[idx_test], labels[idx_test])
    return {"losses": losses, "train_acc": train_acc, "test_loss": loss_test.item(),
            "test_acc": accuracy(output[idx_test], labels[idx_test]),
            "output": output.detach().cpu(),
            "model": {k: v.cpu() for k, v in model.state_dict().items()}}


if __name__ == "__main__":
    result = main(*sys.argv[1:2])
    print(result["losses"], result["test_acc"])
