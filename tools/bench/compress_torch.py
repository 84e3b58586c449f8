#!/usr/bin/python3
"""torch.topk reference for tools/bench/compress.sh: for d = 235,146 and 4,194,304 (N(0, 1)),
the median time of torch.topk(|x|, k = round(d / 100)) on one thread, with |x| precomputed
(topk alone) and computed in the timed call (abs + topk). Prints one line per d:
    D TOPK_MS ABS_TOPK_MS"""
import sys
import time

import torch

torch.set_num_threads(1)
samples = int(sys.argv[1]) if len(sys.argv) > 1 else 15


def median_ms(fn):
    t0 = time.perf_counter()
    reps = 0
    while time.perf_counter() - t0 < 0.02:
        fn()
        reps += 1
    s = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        s.append((time.perf_counter() - t0) / reps)
    s.sort()
    return s[len(s) // 2] * 1e3


g = torch.Generator().manual_seed(1)
for d in (235146, 4194304):
    x = torch.randn(d, generator=g)
    a = x.abs()
    k = round(d / 100)
    t_topk = median_ms(lambda: torch.topk(a, k))
    t_abs = median_ms(lambda: torch.topk(x.abs(), k))
    print(f"{d} {t_topk:.4f} {t_abs:.4f}", flush=True)
