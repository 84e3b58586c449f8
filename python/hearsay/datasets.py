"""IDX image sets (the MNIST format, gzip or raw) as NumPy arrays, and the rank's IID shard, for
the examples and benchmarks. Debian's dataset-fashion-mnist installs the files in DEFAULT_DIR."""
import gzip
import os
from typing import Any, Tuple

import numpy as np
import numpy.typing as npt

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
# Fashion-MNIST's training-set pixel mean and standard deviation (as the C loader normalises).
MEAN, STD = 0.2860, 0.3530
_dtypes: dict[int, Any] = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str) -> npt.NDArray[Any]:
    """One IDX file as an array of its own shape; ValueError names what is malformed."""
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as g:
            raw = g.read()
    else:
        with open(path, "rb") as f:
            raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _dtypes:
        raise ValueError(f"{path}: not an IDX file (bad magic)")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise ValueError(f"{path}: truncated header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    dt = np.dtype(_dtypes[raw[2]])
    want = int(np.prod(shape)) * dt.itemsize
    if len(raw) - (4 + 4 * ndim) != want:
        raise ValueError(f"{path}: {len(raw) - 4 - 4 * ndim} bytes of data, expected {want}")
    return np.frombuffer(raw, dtype=dt, offset=4 + 4 * ndim).reshape(shape)


def _find(d: str, stem: str) -> str:
    for name in (stem + ".gz", stem):
        p = os.path.join(d, name)
        if os.path.exists(p):
            return p
    raise FileNotFoundError(f"{d}: no {stem}[.gz] (install dataset-fashion-mnist)")


def fashion_mnist(directory: str = DEFAULT_DIR, train: bool = True,
                  subset: int = 0) -> Tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """(images float32 N x 1 x 28 x 28, normalised; labels int64 N) of the training or test
    set; subset > 0 keeps the first `subset` examples."""
    pre = "train" if train else "t10k"
    x = read_idx(_find(directory, f"{pre}-images-idx3-ubyte"))
    y = read_idx(_find(directory, f"{pre}-labels-idx1-ubyte"))
    if len(x) != len(y):
        raise ValueError(f"{directory}: {len(x)} {pre} images but {len(y)} labels")
    if subset > 0:
        x, y = x[:subset], y[:subset]
    x = ((x.astype(np.float32) / np.float32(255.0)) - np.float32(MEAN)) / np.float32(STD)
    return x.reshape(-1, 1, x.shape[1], x.shape[2]), y.astype(np.int64)


def shard(n: int, rank: int, world: int, seed: int = 1) -> npt.NDArray[np.int64]:
    """Indices of rank's IID shard of n examples: a seeded permutation cut into world parts."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in 0..{world - 1}")
    perm = np.random.default_rng(seed).permutation(n)
    part: npt.NDArray[np.int64] = np.array_split(perm, world)[rank]
    return part
