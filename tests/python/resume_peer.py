#!/usr/bin/python3
"""One peer of the simultaneous-resume test. Each round: a local update towards its shard
(x -= 0.1 (x - rank)), then a gossip step; alone a peer ends at its rank, two peers of one job
end near each other.

    resume_peer.py KILL OUT [NAME=VALUE...]
        runs the job (resumes it with resume=1); KILL > 0: KILL rounds after its first round it
        kills itself (SIGKILL: no leave, its checkpoints are what is left); else it runs to the
        job's end and writes the final vector to OUT
"""
import os
import signal
import sys

import numpy as np

import hearsay


def main(argv):
    kill, out = int(argv[0]), argv[1]
    opts = dict(a.partition("=")[::2] for a in argv[2:])
    x = np.full(1000, 0.5, np.float32)
    with hearsay.Node(opts) as node:
        node.start(x)
        first, rank = node.round, np.float32(node.rank)
        print(f"started at round {first} as peer {node.id} rank {node.rank}", flush=True)
        while True:
            x -= np.float32(0.1) * (x - rank)
            if not node.step(x):
                break
            if kill and node.round >= first + kill:
                os.kill(os.getpid(), signal.SIGKILL)
        print(f"ended at round {node.round} rank {node.rank}", flush=True)
    x.tofile(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
