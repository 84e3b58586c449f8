#!/usr/bin/python3
"""PyTorch reference for tools/bench/train: the same model (--model mlp: 784-256-128-10, ReLU;
--model cnn-small: conv3x3(1->16, pad 1)-ReLU-maxpool2, conv3x3(16->32, pad 1)-ReLU-maxpool2,
linear 1568->128, ReLU, linear 128->10; --model resnet20: hearsay's resnet20, He et al.'s
CIFAR ResNet-20 with GroupNorm (8 groups) after every convolution, no convolution biases and
the parameter-free shortcut, option A), the same optimizer (SGD, momentum 0.9, weight decay
1e-4), batch 128, one epoch over Fashion-MNIST (or its first --subset examples), or with
--cifar DIR over the CIFAR-10 binary batches in DIR, with the data preloaded as tensors, so
only the training loop is timed. Prints samples/s."""
import argparse
import gzip
import sys
import time

import os

import numpy as np
import torch
import torch.nn.functional as F


def load(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def load_cifar(d):
    """The training batches of a CIFAR-10 binary set, standardised per channel as hearsay
    does (pixel / 255, then the channel's mean and standard deviation)."""
    raw = np.concatenate([np.fromfile(os.path.join(d, f"data_batch_{i}.bin"), dtype=np.uint8)
                          for i in range(1, 6)]).reshape(-1, 3073)
    y = raw[:, 0].astype(np.int64)
    x = raw[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32) / 255.0
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    std = x.std(axis=(0, 2, 3), keepdims=True)
    return (x - mean) / std, y


def resnet20(nn, F, classes):
    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.g1 = nn.GroupNorm(8, cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.g2 = nn.GroupNorm(8, cout)
            self.stride, self.extra = stride, cout - cin

        def forward(self, x):
            o = self.g2(self.c2(F.relu(self.g1(self.c1(x)))))
            s = x[:, :, ::self.stride, ::self.stride] if self.stride > 1 else x
            if self.extra:
                s = F.pad(s, (0, 0, 0, 0, 0, self.extra))
            return F.relu(o + s)

    layers = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.GroupNorm(8, 16), nn.ReLU()]
    cin = 16
    for stage in range(3):
        for block in range(3):
            cout = 16 << stage
            layers.append(Block(cin, cout, 2 if stage > 0 and block == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes)]
    return nn.Sequential(*layers)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn-small", "resnet20"])
    p.add_argument("--cifar", default="", help="a CIFAR-10 binary set instead of --data")
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps")
    p.add_argument("--warmup", type=int, default=0, help="untimed steps before timing")
    p.add_argument("--subset", type=int, default=0)
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"],
                   help="fp32: no TF32 anywhere (cuDNN's default allows it); tf32: TF32 matmuls "
                        "and convolutions; bf16: autocast to bfloat16 with channels-last "
                        "activations (PyTorch's AMP; FP32 parameters)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    if a.cifar:
        x, y = load_cifar(a.cifar)
    else:
        x = load(f"{a.data}/train-images-idx3-ubyte.gz", 16).reshape(-1, 784).astype(np.float32)
        y = load(f"{a.data}/train-labels-idx1-ubyte.gz", 8).astype(np.int64)
        x = (x / 255.0 - 0.2860) / 0.3530
    if a.subset > 0:
        x, y = x[:a.subset], y[:a.subset]
    x = torch.from_numpy(x)
    y = torch.from_numpy(y)
    nn = torch.nn
    if a.model == "resnet20":
        model = resnet20(nn, F, 10)
    elif a.model == "cnn-small":
        x = x.reshape(-1, 1, 28, 28)
        model = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(1568, 128), nn.ReLU(), nn.Linear(128, 10))
    else:
        model = nn.Sequential(
            nn.Linear(784, 256), nn.ReLU(),
            nn.Linear(256, 128), nn.ReLU(),
            nn.Linear(128, 10))
    dev = torch.device(a.device)
    model = model.to(dev)
    x, y = x.to(dev), y.to(dev)
    if a.precision == "bf16" and x.dim() == 4:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    if a.compile and not hasattr(torch, "compile"):
        print(f"train_torch: --compile needs PyTorch 2 (this is {torch.__version__})",
              file=sys.stderr)
        return 2
    fwd = torch.compile(model) if a.compile else model
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=1e-4)
    n = x.shape[0]

    def step(idx):
        xb, yb = x[idx], y[idx]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = F.cross_entropy(fwd(xb), yb)
        loss.backward()
        opt.step()
        return loss

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    # Untimed steps first (--warmup): CUDA's context, cuDNN's algorithm choice, allocator.
    for _ in range(a.warmup):
        step(torch.randperm(n, device=dev)[:a.batch])
    sync()
    samples = steps = 0
    t0 = time.perf_counter()
    for _ in range(a.epochs):
        perm = torch.randperm(n, device=dev)
        for i in range(0, n, a.batch):
            if a.steps and steps == a.steps:
                break
            loss = step(perm[i:i + a.batch])
            samples += min(a.batch, n - i)
            steps += 1
    sync()
    dt = time.perf_counter() - t0
    print(f"torch {torch.__version__}: {samples / dt:.0f} samples/s "
          f"({samples} samples in {dt:.2f} s, {a.threads} threads, {a.device}, {a.precision}"
          f"{', compiled' if a.compile else ''}, "
          f"final loss {loss.item():.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
