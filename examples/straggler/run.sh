#!/usr/bin/env bash
# One straggler: 8 real peers on this machine, peer 0 computing 4x slower (--slowdown 0:4).
# Synchronous D-PSGD waits for it every round; SGP (push-sum on the one-peer exponential graph)
# does not. Both run the same wall-clock budget; compare rounds done and accuracy. Expected: the
# fast SGP peers complete about 4x the straggler's rounds and reach a given accuracy in well under
# the synchronous run's time; D-PSGD peers all advance at the straggler's pace.
#   examples/straggler/run.sh [seconds]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
hs=${HEARSAY:-$here/../../build/hearsay}
secs=${1:-60}
data=()
n=8
if [[ -n ${HEARSAY_EXAMPLE_SHORT:-} ]]; then
    secs=3
    n=4
    data=(--synthetic --subset 4000 --no-plot)
fi
stamp=$(date +%Y%m%d-%H%M%S)
for algo in dpsgd sgp; do
    echo "== $algo, peer 0 at 4x, ${secs}s"
    "$hs" launch --peers $n --algo "$algo" --slowdown 0:4 --rounds 1000000 --eval-every 50 \
        --name "straggler-$algo-$stamp" "${data[@]}" &
    pid=$!
    sleep "$secs"
    kill -INT $pid
    wait $pid || true
done
