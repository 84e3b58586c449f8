#!/usr/bin/python3
"""hearsay from PyTorch against what a PyTorch user would otherwise run: torch.distributed DDP
with gloo all-reduce. n processes on this machine train the CNN of examples/pytorch/fmnist.py
on their IID Fashion-MNIST shards (batch 128 each, SGD lr 0.05 momentum 0.9, the same number of
steps and epochs) in three modes: ddp (gradients all-reduced by gloo each step), choco
(hearsay.torch, CHOCO-SGD top-1% on a ring) and dpsgd (hearsay.torch, D-PSGD, full vectors on a
ring). Both run on plain TCP over loopback (hearsay --insecure; gloo has no encryption).

Per mode: time per training step, communication time per step (ddp: the gloo all-reduce, timed
by a blocking comm hook; hearsay: the time in Gossip.step, the gossip round with its waits),
bytes sent per step and peer (hearsay: measured by the node; ddp: a ring all-reduce's
2 (n - 1) / n * 4 d, what gloo's ring algorithm sends) and the mean test accuracy at the end.
One JSON line per mode, then a table. With --comm-only R, the processes only communicate, R
rounds (no training, so no waiting for a slower peer's compute): the transfer cost alone.

    /usr/bin/python3 tools/bench/python/ddp_vs_hearsay.py [--n 8] [--epochs 2] [--modes ddp,choco,dpsgd]
        [--gamma-c G] [--comm-only ROUNDS] [--seed 1]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(root, "examples", "pytorch"))
sys.path.insert(0, os.path.join(root, "python"))


def worker(a):
    import torch

    import fmnist

    torch.set_num_threads(1)
    (x, y), (tx, ty) = fmnist.load(a.rank, a.n, subset=a.subset, test_subset=a.test_subset,
                                   seed=a.seed)
    model = fmnist.cnn(seed=a.seed)
    d = sum(p.numel() for p in model.parameters())
    comm = [0.0]
    if a.mode == "ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("gloo", init_method=f"file://{a.dir}/pg", rank=a.rank,
                                world_size=a.n)
        model = DDP(model)

        def timed_allreduce(state, bucket):
            # Blocking, so that the time is the all-reduce's own (DDP would overlap it with the
            # backward pass; on a shared 2-core machine there is nothing to overlap with).
            t0 = time.perf_counter()
            buf = bucket.buffer()
            dist.all_reduce(buf)
            buf.div_(a.n)
            comm[0] += time.perf_counter() - t0
            fut = torch.futures.Future()
            fut.set_result(buf)
            return fut

        model.register_comm_hook(None, timed_allreduce)
        net = model.module
    else:
        import hearsay.torch

        net = model
    opt = fmnist.sgd(model, a.lr)
    per_epoch = fmnist.steps_per_epoch(len(y), a.batch)
    steps = int(a.epochs * per_epoch)
    gossip = None
    if a.mode != "ddp":
        gossip = hearsay.torch.Gossip(
            # Each algorithm's own compressor: CHOCO top-1%, D-PSGD none.
            net, algo=a.mode, topology="ring", world=a.n, rank=a.rank, rendezvous=f"{a.dir}/rv",
            insecure=True, listen="127.0.0.1:0", rounds=a.comm_only or steps, quiet=True,
            gamma_c=a.gamma_c,
            on_divergence="warn" if a.comm_only else None)
        gossip.start()
    if a.comm_only:
        return comm_only(a, model if a.mode == "ddp" else gossip, d)
    done, epoch = 0, 0
    t0 = time.perf_counter()
    while done < steps:
        for idx in fmnist.batches(len(y), a.batch, epoch, a.seed):
            fmnist.local_step(model, opt, x[idx], y[idx])
            if gossip is not None:
                gossip.step()
            done += 1
            if done == steps:
                break
        epoch += 1
    dt = time.perf_counter() - t0
    if gossip is not None:
        comm[0] = gossip.seconds
        sent = gossip.metrics()["bytes_sent"] / steps
        gossip.close()
    else:
        sent = 2 * (a.n - 1) / a.n * 4 * d
    acc = fmnist.accuracy(net, tx, ty)
    with open(f"{a.dir}/out{a.rank}.json", "w") as f:
        json.dump({"step_ms": 1e3 * dt / steps, "comm_ms": 1e3 * comm[0] / steps,
                   "bytes_per_step": sent, "accuracy": acc, "steps": steps, "d": d}, f)


def comm_only(a, what, d):
    """Communication alone, a.comm_only rounds: gloo's all-reduce of the d parameters, or one
    gossip round, with no training between them (so no waiting for a slower peer's compute)."""
    import torch

    if a.mode == "ddp":
        import torch.distributed as dist

        buf = torch.zeros(d)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.comm_only):
            dist.all_reduce(buf)
        dt, sent = time.perf_counter() - t0, 2 * (a.n - 1) / a.n * 4 * d
    else:
        t0 = time.perf_counter()
        while what.step():
            pass
        dt, sent = time.perf_counter() - t0, what.metrics()["bytes_sent"] / a.comm_only
        what.close()
    with open(f"{a.dir}/out{a.rank}.json", "w") as f:
        json.dump({"step_ms": 1e3 * dt / a.comm_only, "comm_ms": 1e3 * dt / a.comm_only,
                   "bytes_per_step": sent, "accuracy": float("nan"), "steps": a.comm_only,
                   "d": d}, f)


def run_mode(a, mode):
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode, "--dir", d,
               "--n", str(a.n), "--epochs", str(a.epochs), "--subset", str(a.subset),
               "--test-subset", str(a.test_subset), "--lr", str(a.lr), "--batch", str(a.batch),
               "--seed", str(a.seed),
               "--comm-only", str(a.comm_only)]
        if a.gamma_c:
            cmd += ["--gamma-c", str(a.gamma_c)]
        procs = [subprocess.Popen(cmd + ["--rank", str(r)], env=env) for r in range(a.n)]
        try:
            for p in procs:
                if p.wait(timeout=a.timeout) != 0:
                    raise SystemExit(f"{mode}: a worker failed ({p.returncode})")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        outs = [json.load(open(f"{d}/out{r}.json")) for r in range(a.n)]
    mean = lambda k: sum(o[k] for o in outs) / len(outs)  # noqa: E731
    return {"bench": "ddp_vs_hearsay", "mode": mode, "n": a.n, "epochs": a.epochs,
            "comm_only": a.comm_only, "gamma_c": a.gamma_c,
            "d": outs[0]["d"], "steps": outs[0]["steps"], "step_ms": round(mean("step_ms"), 2),
            "comm_ms": round(mean("comm_ms"), 3), "bytes_per_step": round(mean("bytes_per_step")),
            "accuracy": round(100 * mean("accuracy"), 2),
            "accuracy_min": round(100 * min(o["accuracy"] for o in outs), 2)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--epochs", type=float, default=2)
    p.add_argument("--modes", default="ddp,choco,dpsgd")
    p.add_argument("--subset", type=int, default=0)
    p.add_argument("--test-subset", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--seed", type=int, default=1,
                   help="the model's initialisation, the shards and the batch order (as "
                   "examples/pytorch/train.py --seed)")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--gamma-c", type=float, default=None, help="CHOCO's consensus step (default: "
                   "the library's automatic one)")
    p.add_argument("--comm-only", type=int, default=0, metavar="ROUNDS",
                   help="time ROUNDS communication rounds alone, without training")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--mode")
    p.add_argument("--rank", type=int)
    p.add_argument("--dir")
    a = p.parse_args()
    if a.worker:
        return worker(a)
    rows = []
    for mode in a.modes.split(","):
        rows.append(run_mode(a, mode))
        print(json.dumps(rows[-1]), flush=True)
    print(f"{'mode':6} {'step ms':>8} {'comm ms':>8} {'bytes/step':>11} {'accuracy':>9}")
    for r in rows:
        print(f"{r['mode']:6} {r['step_ms']:8.2f} {r['comm_ms']:8.3f} {r['bytes_per_step']:11d} "
              f"{r['accuracy']:8.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
