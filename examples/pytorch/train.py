#!/usr/bin/python3
"""One peer of the PyTorch example: trains the CNN of fmnist.py on its Fashion-MNIST shard and
gossips its parameters through hearsay after every optimizer step (run.sh starts N of them).
Every peer runs the same number of rounds (the job's `rounds`), so all end together. Prints
"peer R: test accuracy A% ..." at the end.

    train.py --rank R --world N --rendezvous FILE [--secret-file F | --insecure]
             [--algo choco] [--compress C (default: the algorithm's)] [--epochs 2]
             [--subset 0] [--listen HOST:0] [--save FILE] [--alone] [--seed 1]
             [--momentum-kind local|qg] [--schedule constant|cosine]
"""
import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fmnist  # noqa: E402

import hearsay  # noqa: E402
import hearsay.torch  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--rendezvous", required=True)
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--secret-file")
    p.add_argument("--insecure", action="store_true")
    p.add_argument("--algo", default="choco")
    p.add_argument("--compress", default=None)
    p.add_argument("--gamma-c", type=float, default=None, help="default: automatic")
    p.add_argument("--topology", default="ring")
    p.add_argument("--momentum-kind", default="local", choices=("local", "qg"),
                   help="hearsay.torch.Gossip's momentum_kind: torch's own momentum, or qg")
    p.add_argument("--epochs", type=float, default=2)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--schedule", default="constant", choices=("constant", "cosine"),
                   help="the learning rate over the run: constant, or cosine decay to 0")
    p.add_argument("--seed", type=int, default=1,
                   help="the model's initialisation, the shards and the batch order")
    p.add_argument("--subset", type=int, default=0)
    p.add_argument("--test-subset", type=int, default=0)
    p.add_argument("--data", default=hearsay.datasets.DEFAULT_DIR)
    p.add_argument("--metrics", default=None)
    p.add_argument("--save", default=None, help="write the final parameters (raw float32)")
    p.add_argument("--alone", action="store_true",
                   help="train on this rank's shard without gossip: the baseline gossip must beat")
    a = p.parse_args()
    torch.set_num_threads(1)

    (x, y), (tx, ty) = fmnist.load(a.rank, a.world, a.data, a.subset, a.test_subset, a.seed)
    model = fmnist.cnn(seed=a.seed)
    opt = fmnist.sgd(model, a.lr)
    per_epoch = fmnist.steps_per_epoch(len(y), a.batch)
    rounds = max(1, int(a.epochs * per_epoch))
    sched = (torch.optim.lr_scheduler.CosineAnnealingLR(opt, rounds) if a.schedule == "cosine"
             else None)
    if a.alone:
        return train_alone(a, model, opt, sched, x, y, tx, ty, rounds, per_epoch)
    gossip = hearsay.torch.Gossip(
        model, algo=a.algo, compress=a.compress, topology=a.topology, world=a.world,
        rank=a.rank, rendezvous=a.rendezvous, listen=a.listen, secret_file=a.secret_file,
        insecure=a.insecure or None, rounds=rounds, metrics=a.metrics, quiet=True,
        gamma_c=a.gamma_c, optimizer=opt, momentum_kind=a.momentum_kind)
    with gossip:
        gossip.start()
        t0 = time.perf_counter()
        epoch, loss = 0, math.nan
        while gossip.running:
            for idx in fmnist.batches(len(y), a.batch, epoch, a.seed):
                loss = fmnist.local_step(model, opt, x[idx], y[idx])
                if sched is not None:
                    sched.step()
                gossip.report(loss=loss)
                if not gossip.step():
                    break
            epoch += 1
        dt = time.perf_counter() - t0
        if a.save:
            gossip.flat.detach().cpu().numpy().tofile(a.save)
        acc = fmnist.accuracy(model, tx, ty)
        m = gossip.metrics() or {}
        print(f"peer {a.rank}: test accuracy {100 * acc:.2f}% after {gossip.steps} rounds "
              f"({rounds / per_epoch:.2f} epochs), loss {loss:.4f}, "
              f"{m.get('bytes_sent', 0) / 1e6:.3f} MB sent, {dt:.1f} s, "
              f"{1e3 * gossip.seconds / max(1, gossip.steps):.2f} ms/round in gossip", flush=True)
    return 0


def train_alone(a, model, opt, sched, x, y, tx, ty, rounds, per_epoch):
    """The same steps on the same shard with no communication at all."""
    t0 = time.perf_counter()
    steps, epoch, loss = 0, 0, math.nan
    while steps < rounds:
        for idx in fmnist.batches(len(y), a.batch, epoch, a.seed):
            loss = fmnist.local_step(model, opt, x[idx], y[idx])
            if sched is not None:
                sched.step()
            steps += 1
            if steps == rounds:
                break
        epoch += 1
    acc = fmnist.accuracy(model, tx, ty)
    print(f"peer {a.rank}: test accuracy {100 * acc:.2f}% after {steps} steps alone "
          f"({rounds / per_epoch:.2f} epochs), loss {loss:.4f}, 0 MB sent, "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except hearsay.Error as e:
        print(f"train.py: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
