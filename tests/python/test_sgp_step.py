#!/usr/bin/python3
"""SGP through the node API: the caller's update of z = x / w lands on z as it is, whatever the
push-sum weight w, as in `hearsay run`'s trainer and in the reference SGP (Assran et al. 2019,
whose optimizer steps the de-biased parameters). Adding the caller's change to the numerator x
unscaled moves z by change / w: a peer that had received few shares (w 0.07 was measured on a
loaded machine) took a 14x step and the PyTorch example diverged (issue 19).

w is made to leave 1 without any timing: two peers in threads of this process on a directed
schedule in which peer 1 never sends to peer 0 in the rounds run, so peer 0 keeps half its mass
each round and receives nothing: w_0 = 2^-(r+1), and its z moves by its own changes only. Peer 0
asserts that z moved by exactly the change it made. Exit 77 when /usr/bin/python3 lacks NumPy.
Env: HEARSAY_LIB, HS_TEST_IP (a loopback address)."""
import json
import os
import shutil
import signal
import sys
import tempfile
import threading

try:
    import numpy as np
except ImportError:
    print("SKIP: no numpy")
    sys.exit(77)

import hearsay

IP = os.environ.get("HS_TEST_IP", "127.0.0.1")
D, ROUNDS = 1000, 6
results = {}


def peer(rank, opts):
    try:
        rng = np.random.default_rng(100 + rank)
        x = np.linspace(-1, 1, D, dtype=np.float32)
        with hearsay.Node(rank=rank, **opts) as node:
            node.start(x)
            moved = []
            while True:
                before = x.copy()
                change = (0.01 * rng.standard_normal(D)).astype(np.float32)
                x += change
                going = node.step(x)
                m = node.metrics() or {}
                got = x - before
                moved.append((float(np.dot(got, change) / np.dot(change, change)),
                              float(np.abs(got - change).max()), m.get("push_weight")))
                if not going:
                    break
            results[m.get("peer")] = moved
    except Exception as e:  # reported by the main thread
        results[f"rank {rank}"] = e


def main():
    signal.alarm(60)  # the test's own deadline: the nodes are threads of this process
    tmp = tempfile.mkdtemp(prefix="hs-sgp-step-")
    try:
        # Rounds 0..62: 0 -> 1 only (peer 0 keeps 1/2, peer 1 keeps all); round 63: 1 -> 0, so
        # that the union graph is strongly connected.
        sched = [{"edges": [[0, 1, 0.5]]}] * 63 + [{"edges": [[1, 0, 0.5]]}]
        topo = os.path.join(tmp, "oneway.json")
        with open(topo, "w") as f:
            json.dump({"peers": 2, "directed": True, "schedule": sched}, f)
        opts = dict(world=2, insecure=True, listen=f"{IP}:0", quiet=True, algo="sgp",
                    compress="none", topology=topo, rounds=ROUNDS,
                    rendezvous=os.path.join(tmp, "rdv"))
        ts = [threading.Thread(target=peer, args=(r, opts), daemon=True) for r in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(50)
        errs = [v for v in results.values() if isinstance(v, Exception)]
        if errs:
            raise errs[0]
        assert 0 in results and 1 in results, f"peers finished: {sorted(results)}"
        for r, (ratio, err, w) in enumerate(results[0]):
            print(f"peer 0 round {r}: w {w}, z moved {ratio:.4f} x its change (max error {err:.2g})")
            assert w == 0.5 ** (r + 1), f"round {r}: push-sum weight {w}, expected {0.5 ** (r + 1)}"
            assert abs(ratio - 1.0) < 1e-3 and err < 1e-4, \
                f"round {r}: z moved {ratio:.4f} x the caller's change at w = {w}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
