#!/usr/bin/python3
"""Writes a random CIFAR-10 binary set for the training benchmarks (tools/bench/train --model
resnet20, tools/bench/train_gpu): data_batch_1.bin .. data_batch_5.bin with --train / 5 records
each and test_batch.bin with --test records, each record a label byte (0..9) and 3 x 32 x 32
pixel bytes, from a fixed seed. Throughput does not depend on the pixels; hearsay and PyTorch
read the same files.

    gen_cifar.py DIR [--train N] [--test N]"""
import argparse
import os
import sys

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--train", type=int, default=2560)
    p.add_argument("--test", type=int, default=256)
    a = p.parse_args()
    if a.train < 5 or a.train % 5 or a.test < 1:
        print("gen_cifar.py: --train must be a positive multiple of 5, --test positive",
              file=sys.stderr)
        return 2
    os.makedirs(a.dir, exist_ok=True)
    rng = np.random.default_rng(1)
    files = [(f"data_batch_{i}.bin", a.train // 5) for i in range(1, 6)]
    for name, n in files + [("test_batch.bin", a.test)]:
        rec = np.empty((n, 3073), np.uint8)
        rec[:, 0] = rng.integers(0, 10, n)
        rec[:, 1:] = rng.integers(0, 256, (n, 3072))
        rec.tofile(os.path.join(a.dir, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
