#!/usr/bin/python3
"""Cost of the gossip on a training step, with and without hearsay.torch's overlap (issue 22
item 6): N processes on this machine (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, as torchrun
sets them) train an MLP of about 25M parameters (1024-4096-4096-1000) on random batches, in
three modes: none (no gossip: the reference step time), sync (Gossip.step after every H-th
step, the copies and the round on the critical path) and overlap (Gossip(overlap=True)). One
JSON line per mode and rank, then the median step time per mode and the overhead over none.
Goal of the issue: <= 10% for CHOCO top-1% at H = 1 and <= 2% at H >= 16, on a GPU.

    /usr/bin/python3 tools/bench/python/gpu_overlap.py [--device cuda] [--n 2] [--steps 200]
        [--local-steps 1] [--algo choco] [--compress topk:0.01] [--width 4096]
(env: HEARSAY_LIB, PYTHONPATH=python as for the tests; --device cpu with a small --width
checks that the script runs)"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def worker(a):
    import torch

    import hearsay.torch

    rank = int(os.environ["RANK"])
    dev = torch.device(a.device)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(1024, a.width), torch.nn.ReLU(),
                                torch.nn.Linear(a.width, a.width), torch.nn.ReLU(),
                                torch.nn.Linear(a.width, 1000)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = None
    if a.mode != "none":
        g = hearsay.torch.Gossip(model, overlap=a.mode == "overlap", algo=a.algo,
                                 compress=a.compress, insecure=True, quiet=True,
                                 on_divergence="warn")
        g.start()
    gen = torch.Generator(device=dev).manual_seed(rank)
    xb = torch.randn(a.batch, 1024, device=dev, generator=gen)
    yb = torch.randint(0, 1000, (a.batch,), device=dev, generator=gen)
    times = []
    for k in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        if g is not None and (k + 1) % a.local_steps == 0:
            g.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    if g is not None:
        g.close()
    warm = times[len(times) // 5:]
    print(json.dumps({"mode": a.mode, "rank": rank, "params": sum(p.numel() for p in model.parameters()),
                      "step_ms": 1e3 * statistics.median(warm), "device": a.device}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--n", type=int, default=2)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--local-steps", type=int, default=1)
    p.add_argument("--algo", default="choco")
    p.add_argument("--compress", default="topk:0.01")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--modes", default="none,sync,overlap")
    p.add_argument("--mode", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.mode:
        return worker(a)
    results = {}
    for mode in a.modes.split(","):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = []
        for r in range(a.n):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.n), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), HEARSAY_RUN_ID=f"bench-{mode}-{port}")
            procs.append(subprocess.Popen([sys.executable, __file__, "--mode", mode] + sys.argv[1:],
                                          env=env, stdout=subprocess.PIPE, text=True))
        rows = [json.loads(pr.communicate()[0].strip().splitlines()[-1]) for pr in procs]
        for row in rows:
            print(json.dumps(row))
        results[mode] = statistics.median(row["step_ms"] for row in rows)
    base = results.get("none")
    print(f"{a.device}, {a.n} processes, H = {a.local_steps}, {a.algo} {a.compress}:")
    for mode, ms in results.items():
        over = f", {100 * (ms / base - 1):+.1f}% over none" if base and mode != "none" else ""
        print(f"  {mode:8s} {ms:8.2f} ms/step{over}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(ROOT, "python"))
    main()
