#!/usr/bin/python3
"""One peer of the state_dict test. Each round: a local update towards its own rank
(x -= 0.1 (x - rank)), then a gossip step.

    state_peer.py save FILE AT KILL [NAME=VALUE...]
        runs the job; AT rounds after its first pickles Node.state_dict() and the vector to
        FILE; KILL rounds after its first kills itself (SIGKILL: no leave, no cleanup)
    state_peer.py resume FILE OUT [NAME=VALUE...]
        loads FILE into a new node, starts it, checks that x became the saved vector, runs the
        job to its end, writes the final vector to OUT and prints the rounds it ran
"""
import os
import pickle
import signal
import sys

import numpy as np

import hearsay


def node_of(args):
    return hearsay.Node(dict(a.partition("=")[::2] for a in args))


def main(argv):
    mode, path = argv[0], argv[1]
    x = np.full(1000, 0.5, np.float32)
    if mode == "save":
        at, kill = int(argv[2]), int(argv[3])
        with node_of(argv[4:]) as node:
            node.start(x)
            first = node.round
            print(f"started at round {first}", flush=True)
            rank = np.float32(node.rank)
            while True:
                x -= np.float32(0.1) * (x - rank)
                assert node.step(x), "the job ended before the kill"
                if node.round == first + at:
                    with open(path + ".tmp", "wb") as f:
                        pickle.dump({"state": node.state_dict(), "x": x.copy()}, f)
                    os.rename(path + ".tmp", path)
                    print(f"saved at round {node.round}", flush=True)
                if node.round == first + kill:
                    os.kill(os.getpid(), signal.SIGKILL)
    with open(path, "rb") as f:
        saved = pickle.load(f)
    out = argv[2]
    with node_of(argv[3:]) as node:
        node.load_state_dict(saved["state"])
        x[:] = 0
        node.start(x)
        assert np.array_equal(x, saved["x"]), "start did not restore the saved vector"
        first = node.round
        rank = np.float32(node.rank)
        steps = 0
        while True:
            x -= np.float32(0.1) * (x - rank)
            steps += 1
            if not node.step(x):
                break
        print(f"resumed at round {first} (saved {saved['state']['round']}), ran {steps} "
              f"rounds to {node.round}, rank {node.rank}", flush=True)
    x.tofile(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
