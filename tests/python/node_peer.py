#!/usr/bin/python3
"""One peer of a seeded synchronous job driven through the Python package, the twin of
node_peer.c: the same starting vector, local update (x -= 0.1 * (x - rank), float32) and
options, so the final vector must have the same bits. Prints the time of the rounds.

    node_peer.py --dim D --out FILE [NAME=VALUE...]
"""
import sys
import time

import numpy as np

import hearsay


def main(argv):
    d, out, opts = 0, None, {}
    it = iter(argv)
    for a in it:
        if a == "--dim":
            d = int(next(it))
        elif a == "--out":
            out = next(it)
        else:
            name, _, value = a.partition("=")
            opts[name] = value
    rank = np.float32(int(opts.get("rank", "0")))
    x = ((np.arange(d) % 101).astype(np.float64) / 101.0 - 0.5).astype(np.float32)
    try:
        with hearsay.Node(opts) as node:
            node.start(x)
            t0, in_step, rounds, going = time.perf_counter(), 0.0, 0, True
            while going:
                x -= np.float32(0.1) * (x - rank)
                t1 = time.perf_counter()
                going = node.step(x)
                in_step += time.perf_counter() - t1
                rounds += 1
            print(f"rounds {rounds} seconds {time.perf_counter() - t0:.6f} "
                  f"step_seconds {in_step:.6f}")
    except hearsay.Error as e:
        print(f"node_peer.py: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    x.tofile(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
