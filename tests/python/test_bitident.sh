#!/usr/bin/env bash
# The same seeded synchronous job run twice, 4 peers on loopback each time: once by node_peer
# (C, hearsay/node.h) and once by node_peer.py (the Python package over the same library), with
# the same starting vector, local update and options. Every peer's final vector must be the same
# bits in both runs: the Python path adds nothing to the floats. CHOCO top-1% and D-PSGD.
# Peers join in rank order, so that ring neighbours (by peer id) are the same in both runs.
# The ranks pull apart on purpose (each towards its own target): the guard only warns.
# Usage: test_bitident.sh NODE_PEER (env: HEARSAY_LIB, HS_SOURCE_ROOT)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
need_python numpy
cpeer=$1
d=20011
for algo in choco:topk:0.01 dpsgd:none; do
    a=${algo%%:*}
    c=${algo#*:}
    for kind in c py; do
        cmd=("$cpeer")
        [[ $kind == py ]] && cmd=("$py" "$here/node_peer.py")
        mkdir -p "$tmp/$a-$kind"
        IN_ORDER=1 run_peers 4 "$tmp/$a-$kind/p" "${cmd[@]}" --dim $d --out "$tmp/$a-$kind/x{R}" \
            algo=$a compress=$c topology=ring world=4 rank={R} rounds=25 seed=7 insecure=1 \
            listen=$ip:0 rendezvous="$tmp/$a-$kind/rv" run-id="bit-$a-$kind-$$" on-divergence=warn
    done
    for r in 0 1 2 3; do
        cmp "$tmp/$a-c/x$r" "$tmp/$a-py/x$r" || fail "$a: peer $r's final vector differs between C and Python"
    done
    # The gossip did something: each peer ended elsewhere than its local updates alone lead.
    "$py" - "$tmp/$a-c" $d <<'PY' || fail "$a: the vectors show no gossip"
import sys, numpy as np
d = int(sys.argv[2])
for r in range(4):
    x = np.fromfile(f"{sys.argv[1]}/x{r}", np.float32)
    alone = ((np.arange(d) % 101).astype(np.float64) / 101.0 - 0.5).astype(np.float32)
    for _ in range(25):
        alone -= np.float32(0.1) * (alone - np.float32(r))
    assert x.size == d and np.abs(x - alone).max() > 1e-4, (r, np.abs(x - alone).max())
PY
    echo "ok: $a: 4 peers, C and Python final vectors are bit-identical"
done
