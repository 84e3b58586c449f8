"""The example's PyTorch model and data, shared by train.py and the benchmarks against DDP
(tools/bench/python/): the CNN of `hearsay train --model cnn-small`, the rank's IID shard of
Fashion-MNIST, one local SGD step and the test accuracy."""
import numpy as np
import torch
import torch.nn.functional as F

from hearsay import datasets


def cnn(seed=1):
    """conv3x3(1->16)-ReLU-maxpool2, conv3x3(16->32)-ReLU-maxpool2, linear 1568->128, ReLU,
    linear 128->10; the same seed gives every peer the same starting parameters."""
    torch.manual_seed(seed)
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(1568, 128), nn.ReLU(), nn.Linear(128, 10))


def load(rank, world, data=datasets.DEFAULT_DIR, subset=0, test_subset=0, seed=1):
    """(train x, train y) of rank's shard and (test x, test y), as tensors."""
    x, y = datasets.fashion_mnist(data, train=True, subset=subset)
    idx = datasets.shard(len(y), rank, world, seed)
    tx, ty = datasets.fashion_mnist(data, train=False, subset=test_subset)
    t = torch.from_numpy
    return (t(np.ascontiguousarray(x[idx])), t(y[idx])), (t(tx), t(ty))


def batches(n, batch, epoch, seed=1):
    """Index tensors of one epoch's mini-batches over n examples (seeded, differs per epoch)."""
    g = torch.Generator().manual_seed(seed * 100003 + epoch)
    perm = torch.randperm(n, generator=g)
    return [perm[i:i + batch] for i in range(0, n - batch + 1, batch)]


def steps_per_epoch(n, batch):
    return n // batch


def local_step(model, opt, x, y):
    """One SGD step on a mini-batch; returns the loss."""
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return float(loss)


def sgd(model, lr=0.05):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)


@torch.no_grad()
def accuracy(model, x, y, batch=1000):
    model.eval()
    correct = sum(int((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum())
                  for i in range(0, len(y), batch))
    model.train()
    return correct / len(y)
