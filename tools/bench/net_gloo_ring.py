#!/usr/bin/python3
"""The torch.distributed (gloo) reference of the 8-peer ring round (tools/bench/net): every rank
exchanges its vector of N floats with both ring neighbours (isend/irecv, then wait) and averages
(x + left + right) / 3, as netpeer does. Prints the median and mean round time across ranks as
one JSON line.

    /usr/bin/python3 tools/bench/net_gloo_ring.py RANKS ROUNDS [FLOATS] [PORT]
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, size, rounds, n, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=size)
    x = torch.full((n,), float(rank))
    lbuf, rbuf = torch.empty(n), torch.empty(n)
    left, right = (rank + size - 1) % size, (rank + 1) % size
    dist.barrier()
    times = []
    t_all = time.perf_counter()
    for _ in range(rounds):
        t0 = time.perf_counter()
        reqs = [dist.isend(x, right), dist.isend(x, left), dist.irecv(lbuf, left),
                dist.irecv(rbuf, right)]
        for q in reqs:
            q.wait()
        x = (x + lbuf + rbuf) / 3.0
        times.append((time.perf_counter() - t0) * 1e3)
    t_all = (time.perf_counter() - t_all) * 1e3 / rounds
    out[rank] = (statistics.median(times), t_all, float(x[0]))
    dist.destroy_process_group()


def main():
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 235146
    port = int(sys.argv[4]) if len(sys.argv) > 4 else 29533
    with mp.Manager() as m:
        out = m.dict()
        mp.spawn(run, args=(size, rounds, n, port, out), nprocs=size, join=True)
        meds = sorted(v[0] for v in out.values())
        mean = sum(v[1] for v in out.values()) / size
        print(json.dumps({"bench": "ring", "kind": "gloo", "ranks": size, "floats": n,
                          "rounds": rounds, "round_ms_median": round(meds[size // 2], 4),
                          "round_ms_mean": round(mean, 4), "x0": out[0][2]}))


if __name__ == "__main__":
    main()
