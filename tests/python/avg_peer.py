#!/usr/bin/python3
"""A peer that only gossips: it starts from a vector full of VALUE, runs the job's rounds with no
local update and checks that it ended at EXPECT (the average of the peers' values). Options are
NAME=VALUE arguments; anything not given (rank, world, rendezvous) comes from the environment,
as a launcher would set it. Prints the library it loaded and the rank and id the node took.

    avg_peer.py --value V --expect E [NAME=VALUE...]

V may name an environment variable instead (--value RANK: a launcher's rank).
"""
import os
import sys

import numpy as np

import hearsay


def main(argv):
    value, expect, opts = 0.0, 0.0, {}
    it = iter(argv)
    for a in it:
        if a == "--value":
            v = next(it)
            value = float(os.environ[v] if v.isidentifier() else v)
        elif a == "--expect":
            expect = float(next(it))
        else:
            name, _, v = a.partition("=")
            opts[name] = v
    # Peers that start apart look diverged to the guard at round 1: that is the point here.
    opts.setdefault("on-divergence", "warn")
    x = np.full(1000, value, np.float32)
    with hearsay.Node(opts) as node:
        node.start(x)
        while node.step(x):
            pass
        print(f"library {hearsay.library_path()} rank {node.rank} rounds {node.round} id {node.id}")
    err = float(np.abs(x - np.float32(expect)).max())
    print(f"value {value} ended at {float(x.mean()):.6f} (expected {expect}, max error {err:.3g})")
    return 0 if err < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
