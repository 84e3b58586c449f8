#!/usr/bin/env bash
# Compression sweep in the simulator: 8 peers on a ring, IID shards, 10 epochs, CHOCO-SGD with
# no compression, fp16, QSGD (16 levels), top-10%, top-1% and top-0.1%, plus D-PSGD uncompressed
# as the reference. Prints final accuracy (mean, min), MB sent per peer and the consensus
# distance for each. Expected: accuracy within about a point of D-PSGD down to top-1% (the
# consensus step follows the compression: 0.1 at top-1%), then lower at top-0.1%; bytes fall
# with the ratio (about 100x less at top-1%).
#   examples/compression-sweep/run.sh [epochs]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
hs=${HEARSAY:-$here/../../build/hearsay}
epochs=${1:-10}
data=()
if [[ -n ${HEARSAY_EXAMPLE_SHORT:-} ]]; then
    epochs=1
    data=(--synthetic --subset 4000)
fi
printf "%-8s %-12s %10s %10s %14s %12s\n" algo compress "acc mean" "acc min" "MB sent/peer" consensus
for spec in "dpsgd none" "choco none" "choco fp16" "choco qsgd:16" "choco topk:0.1" "choco topk:0.01" "choco topk:0.001"; do
    set -- $spec
    line=$("$hs" sim -n 8 --algo "$1" --compress "$2" --epochs "$epochs" "${data[@]}" --quiet | grep '^final:')
    printf "%-8s %-12s %10s %10s %14s %12s\n" "$1" "$2" \
        "$(sed -n 's/.*mean \([0-9.]*%\).*/\1/p' <<<"$line")" \
        "$(sed -n 's/.* min \([0-9.]*%\).*/\1/p' <<<"$line")" \
        "$(sed -n 's/.*; \([0-9.]*\) MB sent per peer.*/\1/p' <<<"$line")" \
        "$(sed -n 's/.*consensus \([0-9.e+-]*\);.*/\1/p' <<<"$line")"
done
