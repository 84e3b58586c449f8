#!/usr/bin/env bash
# The node API's same-start=0 mode (each peer from a vector of its own, a consensus experiment):
# 4 peers that only average reach the mean of their starts under --on-divergence stop, the
# guard silent (their models start further apart than their own size, and that is no drift).
# Usage: test_same_start.sh AVG_PEER ALGO. Every peer is bounded by a deadline and killed by PID.
set -uo pipefail
peer=$1
algo=$2
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
ip="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$(($$ % 250 + 2))"
n=4
case $algo in
choco) extra=(compress=none gamma-c=0.5) ;;
*) extra=(compress=none) ;;
esac
for ((r = 0; r < n; r++)); do
    timeout 120 "$peer" --dim 1000 algo="$algo" topology=ring world=$n rank=$r rounds=120 \
        seed=3 insecure=1 listen=$ip:0 rendezvous="$tmp/rv" run-id="same-start-$$" \
        same-start=0 on-divergence=stop "${extra[@]}" >"$tmp/p$r.log" 2>&1 &
    pids+=($!)
done
for ((r = 0; r < n; r++)); do
    wait "${pids[$r]}" || fail "peer $r failed: $(tail -3 "$tmp/p$r.log")"
done
for ((r = 0; r < n; r++)); do
    grep -qi "diverg" "$tmp/p$r.log" && fail "peer $r: the guard spoke: $(grep -i diverg "$tmp/p$r.log")"
    line=$(grep "^rounds " "$tmp/p$r.log") || fail "peer $r: no result"
    err=${line##* }
    awk -v e="$err" 'BEGIN { exit !(e < 1e-3) }' || fail "peer $r: $line: not at the mean"
    echo "peer $r: $line"
done
echo "ok: $algo: $n peers from different starts averaged to the mean, the guard silent"
