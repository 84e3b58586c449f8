#!/usr/bin/env bash
# The outer optimizer (SlowMo / DiLoCo Nesterov step after the gossip) against D-PSGD with one
# local step a round: `hearsay sim -n 8`, MLP, Fashion-MNIST, ring, IID. Prints one line per
# setting: mean and worst-peer accuracy and MB sent per peer (from the sim's final line).
# Usage: tools/bench/outer/run.sh [HEARSAY] [EPOCHS] [SEED]
set -uo pipefail
hs=${1:-build/hearsay}
epochs=${2:-5}
seed=${3:-0}
run() {
    local name=$1
    shift
    local out
    out=$(nice -n 10 "$hs" sim -n 8 --epochs "$epochs" --seed "$seed" --quiet "$@" 2>&1 | grep '^final:')
    local mean min mb
    mean=$(sed -n 's/.*mean \([0-9.]*\)%.*/\1/p' <<<"$out")
    min=$(sed -n 's/.* min \([0-9.]*\)%.*/\1/p' <<<"$out")
    mb=$(sed -n 's/.*; \([0-9.]*\) MB sent per peer.*/\1/p' <<<"$out")
    printf '%-44s mean %6s  worst %6s  MB/peer %9s\n' "$name" "$mean" "$min" "$mb"
}
echo "# hearsay sim -n 8, mlp, ring, iid, $epochs epochs, seed $seed"
run "dpsgd H=1 (baseline)" --algo dpsgd
for h in 8 32; do
    run "dpsgd H=$h (local SGD, no outer step)" --algo dpsgd --local-steps "$h"
    for om in "0.7 0.9" "1.0 0.5"; do
        set -- $om
        run "dpsgd H=$h outer $1/$2" --algo dpsgd --local-steps "$h" --outer-lr "$1" --outer-momentum "$2"
    done
done
run "choco topk:0.1 H=32 (no outer step)" --algo choco --compress topk:0.1 --local-steps 32
for om in "0.7 0.9" "1.0 0.5"; do
    set -- $om
    run "choco topk:0.1 H=32 outer $1/$2" --algo choco --compress topk:0.1 --local-steps 32 \
        --outer-lr "$1" --outer-momentum "$2"
done
