#!/usr/bin/env bash
# The outer optimizer (SlowMo / DiLoCo Nesterov step after the gossip, src/train/outer.c)
# against D-PSGD with one local step a round: `hearsay sim -n 8`, MLP, Fashion-MNIST, ring,
# IID, inner SGD lr 0.05 cosine. Prints one line per setting: mean and worst-peer accuracy and
# MB sent per peer (the sim's final line; "diverged" when the guard stopped the run).
# Usage: tools/bench/outer/run.sh [HEARSAY] [EPOCHS] [SEED]   (docs/RESULTS.md: 10 epochs, seed 0)
set -uo pipefail
hs=${1:-build/hearsay}
epochs=${2:-10}
seed=${3:-0}
. "$(dirname "$0")/lib.sh"
o79=(--outer-lr 0.7 --outer-momentum 0.9)
o105=(--outer-lr 1.0 --outer-momentum 0.5)
echo "# hearsay sim -n 8, mlp, ring, iid, $epochs epochs, seed $seed"
run "dpsgd H=1 (baseline)" --algo dpsgd
for h in 8 32; do
    run "dpsgd H=$h, no outer step" --algo dpsgd --local-steps "$h"
    run "dpsgd H=$h, outer 0.7/0.9" --algo dpsgd --local-steps "$h" "${o79[@]}"
    run "dpsgd H=$h, outer 1.0/0.5" --algo dpsgd --local-steps "$h" "${o105[@]}"
    run "dpsgd H=$h, inner momentum 0, outer 0.7/0.9" --algo dpsgd --local-steps "$h" --momentum 0 \
        "${o79[@]}"
done
run "dpsgd H=8, inner momentum 0, no outer step" --algo dpsgd --local-steps 8 --momentum 0
for h in 8 32; do
    c=(--algo choco --compress topk:0.1 --local-steps "$h")
    run "choco topk:0.1 H=$h, no outer step" "${c[@]}"
    run "choco topk:0.1 H=$h, outer 0.7/0.9" "${c[@]}" "${o79[@]}"
    run "choco topk:0.1 H=$h, outer 1.0/0.5" "${c[@]}" "${o105[@]}"
    run "choco topk:0.1 H=$h, inner momentum 0, outer 0.7/0.9" "${c[@]}" --momentum 0 "${o79[@]}"
done
