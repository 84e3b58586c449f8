#!/usr/bin/env bash
# Issue 19, goals 3-4: the outer optimizer over compressed gossip against D-PSGD with one local
# step a round, `hearsay sim -n 8`, Fashion-MNIST, ring, IID, 10 epochs. One line per setting
# (mean, worst peer, MB sent per peer, bytes ratio to the first row, D-PSGD H=1).
#   screen:  the tuning grid as it was run (docs/RESULTS.md: mlp, seed 0; the rows marked
#            "(seed N)" were run on that seed only)
#   confirm: the chosen settings (docs/RESULTS.md: mlp, seeds 0 1 2; cnn-small, seeds 0 1)
#   The rows with fp8 values (topk:K:fp8) are the "Outer optimizer 300x" section's.
# The CHOCO rows pin --gamma-c where the screen compared steps; "auto" rows take the automatic
# step of the build (0.1136 for topk:0.1 when this was measured).
# Usage: [ROWS=REGEX] tools/bench/outer/goal.sh screen|confirm [HEARSAY] [MODEL] [SEED...]
#   ROWS: run only the rows whose name matches (cnn-small: ROWS="^(A'|B):", ROWS="^E:")
set -uo pipefail
mode=${1:?screen or confirm}
hs=${2:-build/hearsay}
model=${3:-mlp}
shift $(($# < 3 ? $# : 3))
seeds=("${@:-0}")
epochs=10
. "$(dirname "$0")/lib.sh"
m0=(--momentum 0 --lr 0.1) # inner SGD without momentum: the outer Nesterov momentum replaces it
o=(--outer-lr 0.7 --outer-momentum 0.9)
o8=(--outer-lr 0.8 --outer-momentum 0.9)
rows() { # NAME|FLAGS lines of the chosen mode
    local dp=(--algo dpsgd) c10=(--algo choco --compress topk:0.1:fp16)
    if [ "$mode" = screen ]; then
        cat <<ROWS
dpsgd H=32 mom 0.9|${dp[*]} --local-steps 32
dpsgd H=32 mom 0.9 outer 1.0/0.3|${dp[*]} --local-steps 32 --outer-lr 1.0 --outer-momentum 0.3
dpsgd H=32 mom 0.9 outer 1.5/0|${dp[*]} --local-steps 32 --outer-lr 1.5 --outer-momentum 0
dpsgd H=32 mom 0 lr 0.2|${dp[*]} --local-steps 32 --momentum 0 --lr 0.2
dpsgd H=32 mom 0 lr 0.2 outer 0.7/0.5|${dp[*]} --local-steps 32 --momentum 0 --lr 0.2 --outer-lr 0.7 --outer-momentum 0.5
dpsgd H=32 mom 0 lr 0.1 outer 0.7/0.9|${dp[*]} --local-steps 32 ${m0[*]} ${o[*]}
exact mean: dpsgd complete H=32 mom 0.9|${dp[*]} --topology complete --local-steps 32
exact mean: dpsgd complete H=8 mom 0.9|${dp[*]} --topology complete --local-steps 8
exact mean: dpsgd complete H=32 outer|${dp[*]} --topology complete --local-steps 32 ${m0[*]} ${o[*]}
exact mean: dpsgd complete H=32 mom 0.9 outer|${dp[*]} --topology complete --local-steps 32 ${o[*]}
exact mean: dpsgd complete H=8 outer|${dp[*]} --topology complete --local-steps 8 ${m0[*]} ${o[*]}
top10% H=8 lr 0.05 auto (last session's best)|--algo choco --compress topk:0.1 --local-steps 8 --momentum 0 ${o[*]}
top10% fp16 H=8 lr 0.05 auto|${c10[*]} --local-steps 8 --momentum 0 ${o[*]}
top10% H=8 lr 0.1 auto|--algo choco --compress topk:0.1 --local-steps 8 ${m0[*]} ${o[*]}
top10% H=8 lr 0.05 auto outer 0.5/0.9|--algo choco --compress topk:0.1 --local-steps 8 --momentum 0 --outer-lr 0.5 --outer-momentum 0.9
top10% H=8 lr 0.05 auto outer 1.0/0.8|--algo choco --compress topk:0.1 --local-steps 8 --momentum 0 --outer-lr 1.0 --outer-momentum 0.8
top10% H=8 lr 0.05 g 0.2|--algo choco --compress topk:0.1 --local-steps 8 --momentum 0 ${o[*]} --gamma-c 0.2
top10% H=8 lr 0.05 g 0.06|--algo choco --compress topk:0.1 --local-steps 8 --momentum 0 ${o[*]} --gamma-c 0.06
top10% fp16 H=8 lr 0.1 g 0.2|${c10[*]} --local-steps 8 ${m0[*]} ${o[*]} --gamma-c 0.2
top10% fp16 H=8 lr 0.2 auto|${c10[*]} --local-steps 8 --momentum 0 --lr 0.2 ${o[*]}
top10% fp16 H=16 lr 0.1 auto|${c10[*]} --local-steps 16 ${m0[*]} ${o[*]}
top10% fp16 H=32 lr 0.1 auto|${c10[*]} --local-steps 32 ${m0[*]} ${o[*]}
top10% fp16 H=32 lr 0.1 auto outer 0.5/0.8|${c10[*]} --local-steps 32 ${m0[*]} --outer-lr 0.5 --outer-momentum 0.8
top10% fp16 H=32 lr 0.1 g 0.2|${c10[*]} --local-steps 32 ${m0[*]} ${o[*]} --gamma-c 0.2
top10% fp16 H=32 lr 0.1 g 0.4|${c10[*]} --local-steps 32 ${m0[*]} ${o[*]} --gamma-c 0.4
top10% fp16 H=32 lr 0.2 g 0.2|${c10[*]} --local-steps 32 --momentum 0 --lr 0.2 ${o[*]} --gamma-c 0.2
top10% fp16 H=32 g 0.2 outer 0.9/0.9|${c10[*]} --local-steps 32 ${m0[*]} --outer-lr 0.9 --outer-momentum 0.9 --gamma-c 0.2
top10% fp16 H=32 g 0.2 adamw lr 0.001|${c10[*]} --local-steps 32 --optimizer adamw ${o[*]} --gamma-c 0.2
top20% fp16 H=32 lr 0.1 g 0.2|--algo choco --compress topk:0.2:fp16 --local-steps 32 ${m0[*]} ${o[*]} --gamma-c 0.2
top10% fp16 H=24 lr 0.1 g 0.2|${c10[*]} --local-steps 24 ${m0[*]} ${o[*]} --gamma-c 0.2
top10% fp16 H=24 lr 0.1 auto|${c10[*]} --local-steps 24 ${m0[*]} ${o[*]}
top8% fp16 H=20 lr 0.1 g 0.2|--algo choco --compress topk:0.08:fp16 --local-steps 20 ${m0[*]} ${o[*]} --gamma-c 0.2
top7% fp16 H=16 lr 0.1 g 0.2|--algo choco --compress topk:0.07:fp16 --local-steps 16 ${m0[*]} ${o[*]} --gamma-c 0.2
top5% fp16 H=16 lr 0.1 g 0.2|--algo choco --compress topk:0.05:fp16 --local-steps 16 ${m0[*]} ${o[*]} --gamma-c 0.2
top3% fp16 H=8 lr 0.1 auto|--algo choco --compress topk:0.03:fp16 --local-steps 8 ${m0[*]} ${o[*]}
top3% fp16 H=8 lr 0.1 g 0.1|--algo choco --compress topk:0.03:fp16 --local-steps 8 ${m0[*]} ${o[*]} --gamma-c 0.1
top10% fp16 H=128 lr 0.1 g 0.2|${c10[*]} --local-steps 128 ${m0[*]} ${o[*]} --gamma-c 0.2
dense fp16 H=128 lr 0.1 g 0.5|--algo choco --compress fp16 --local-steps 128 ${m0[*]} ${o[*]} --gamma-c 0.5
dense fp16 H=32 lr 0.1 g 0.5|--algo choco --compress fp16 --local-steps 32 ${m0[*]} ${o[*]} --gamma-c 0.5
top8% fp16 H=20 g 0.3 (seed 1)|--algo choco --compress topk:0.08:fp16 --local-steps 20 ${m0[*]} ${o[*]} --gamma-c 0.3
top8% fp16 H=20 g 0.2 lr 0.15 (seed 1)|--algo choco --compress topk:0.08:fp16 --local-steps 20 --momentum 0 --lr 0.15 ${o[*]} --gamma-c 0.2
top5% fp16 H=12 g 0.2 (seed 1)|--algo choco --compress topk:0.05:fp16 --local-steps 12 ${m0[*]} ${o[*]} --gamma-c 0.2
top4% fp16 H=10 g 0.2 outer 0.8/0.9 (seed 2)|--algo choco --compress topk:0.04:fp16 --local-steps 10 ${m0[*]} --outer-lr 0.8 --outer-momentum 0.9 --gamma-c 0.2
top7% fp16 H=16 g 0.2 outer 0.8/0.9 (seed 2)|--algo choco --compress topk:0.07:fp16 --local-steps 16 ${m0[*]} --outer-lr 0.8 --outer-momentum 0.9 --gamma-c 0.2
top8% fp16 H=20 g 0.15 outer 0.8/0.9 (seed 2)|--algo choco --compress topk:0.08:fp16 --local-steps 20 ${m0[*]} --outer-lr 0.8 --outer-momentum 0.9 --gamma-c 0.15
top10% fp16 H=24 g 0.2 outer 0.8/0.9 (seed 2)|${c10[*]} --local-steps 24 ${m0[*]} --outer-lr 0.8 --outer-momentum 0.9 --gamma-c 0.2
top8% fp8 H=20 g 0.2 outer 0.8/0.9|--algo choco --compress topk:0.08:fp8 --local-steps 20 ${m0[*]} ${o8[*]} --gamma-c 0.2
top10% fp8 H=16 g 0.2 outer 0.8/0.9|--algo choco --compress topk:0.1:fp8 --local-steps 16 ${m0[*]} ${o8[*]} --gamma-c 0.2
top10% fp8 H=12 g 0.2 outer 0.8/0.9|--algo choco --compress topk:0.1:fp8 --local-steps 12 ${m0[*]} ${o8[*]} --gamma-c 0.2
top8% fp8 H=14 g 0.2 outer 0.8/0.9|--algo choco --compress topk:0.08:fp8 --local-steps 14 ${m0[*]} ${o8[*]} --gamma-c 0.2
top9% fp8 H=16 g 0.2 outer 0.8/0.9|--algo choco --compress topk:0.09:fp8 --local-steps 16 ${m0[*]} ${o8[*]} --gamma-c 0.2
ROWS
    else
        cat <<ROWS
A: top10% fp16 H=8 g 0.2|${c10[*]} --local-steps 8 ${m0[*]} ${o[*]} --gamma-c 0.2
A': top10% fp16 H=8 auto step|${c10[*]} --local-steps 8 ${m0[*]} ${o[*]}
B: top8% fp16 H=20 g 0.2 outer 0.8/0.9|--algo choco --compress topk:0.08:fp16 --local-steps 20 ${m0[*]} --outer-lr 0.8 --outer-momentum 0.9 --gamma-c 0.2
C: top10% fp16 H=32 g 0.2|${c10[*]} --local-steps 32 ${m0[*]} ${o[*]} --gamma-c 0.2
D: dense fp16 H=32 g 0.5|--algo choco --compress fp16 --local-steps 32 ${m0[*]} ${o[*]} --gamma-c 0.5
E: top10% fp8 H=16 g 0.2 outer 0.8/0.9|--algo choco --compress topk:0.1:fp8 --local-steps 16 ${m0[*]} ${o8[*]} --gamma-c 0.2
F: dpsgd H=32 outer 0.7/0.9|--algo dpsgd --local-steps 32 ${m0[*]} ${o[*]}
ROWS
    fi
}
for seed in "${seeds[@]}"; do
    echo "# hearsay sim -n 8 --model $model, ring, iid, $epochs epochs, seed $seed ($mode)"
    unset base_mb
    run "dpsgd H=1 (baseline)" --model "$model" --algo dpsgd
    while IFS='|' read -r name flags; do
        # shellcheck disable=SC2086 # the flags are words
        run "$name" --model "$model" $flags
    done < <(rows | grep -E "${ROWS:-.}")
done
