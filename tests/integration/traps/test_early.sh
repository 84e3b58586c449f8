#!/usr/bin/env bash
# Start-up traps, one case each: refusals that come before the data set is read (the loader's
# "N examples of" line must be absent, the refusal named, exit 2); an earlier metrics file kept.
# Usage: test_early.sh HEARSAY CASE. Every command is bounded by `timeout`.
set -uo pipefail
hs=$1
case=$2
data=/usr/share/datasets/fashion-mnist
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

# refused WHAT EXPECT CMD...: CMD exits 2 with EXPECT in its output and without loading data.
refused() {
    local what=$1 expect=$2 rc
    shift 2
    timeout 60 "$@" >"$tmp/out" 2>&1
    rc=$?
    [[ $rc -eq 2 ]] || fail "$what: exit $rc, expected 2: $(tail -3 "$tmp/out")"
    grep -q -- "$expect" "$tmp/out" || fail "$what: no '$expect' in: $(tail -3 "$tmp/out")"
    grep -q "examples of" "$tmp/out" && fail "$what: refused only after loading the data set"
    echo "ok: $what: $(grep -- "$expect" "$tmp/out" | head -1)"
}

case $case in
refusals)
    [[ -f $data/train-images-idx3-ubyte.gz ]] || { echo "skip: $data not installed"; exit 77; }
    mkdir "$tmp/dir"
    topo=$HS_SOURCE_ROOT/topo/complete-8.json
    # Every option of the data set, so that a late refusal shows in the log.
    d=(--data "$data" --subset 60000)
    # launch refuses before starting any peer (the peers would each refuse on their own).
    refused "launch: hypercube on 6" "not a power of 2" \
        "$hs" launch -n 6 --runs-dir "$tmp/runs" --topology hypercube "${d[@]}"
    [[ -e $tmp/runs ]] && fail "launch: a run directory was made for a refused launch"
    refused "launch: unknown model" "unknown model" \
        "$hs" launch -n 2 --runs-dir "$tmp/runs" --model resnet99 "${d[@]}"
    for c in "sim -n 6" "run --insecure --world 6 --listen 127.0.0.1:0" train; do
        read -ra cmd <<<"$c"
        refused "${cmd[0]}: metrics in a missing directory" "directory $tmp/none does not exist" \
            "$hs" "${cmd[@]}" "${d[@]}" --metrics "$tmp/none/m.jsonl"
        refused "${cmd[0]}: metrics path is a directory" "is a directory" \
            "$hs" "${cmd[@]}" "${d[@]}" --metrics "$tmp/dir"
        refused "${cmd[0]}: unknown model" "unknown model" \
            "$hs" "${cmd[@]}" "${d[@]}" --model resnet99
        [[ ${cmd[0]} == train ]] && continue
        refused "${cmd[0]}: hypercube on 6" "not a power of 2" \
            "$hs" "${cmd[@]}" "${d[@]}" --topology hypercube
        refused "${cmd[0]}: topology file of 8 on 6" "has 8 peers, not 6" \
            "$hs" "${cmd[@]}" "${d[@]}" --topology "$topo"
    done
    ;;
metrics-kept)
    # A second run with the same --metrics keeps the first run's records and says where.
    m=$tmp/m.jsonl
    for i in 1 2; do
        timeout 60 "$hs" train --synthetic --subset 300 --test-subset 100 --epochs 1 --seed $i \
            --quiet --metrics "$m" >"$tmp/out$i" 2>&1 || fail "run $i: $(tail -3 "$tmp/out$i")"
    done
    [[ -s $m.1 && -s $m ]] || fail "expected $m and $m.1: $(ls "$tmp")"
    grep -q "metrics file $m exists: the earlier records moved to $m.1" "$tmp/out2" ||
        fail "no notice: $(cat "$tmp/out2")"
    grep -q "moved" "$tmp/out1" && fail "a notice on the first run"
    cmp -s "$m" "$m.1" && fail "the two runs (seeds 1 and 2) wrote the same records"
    echo "ok: the first run's metrics kept as $m.1"
    ;;
*)
    fail "unknown case $case"
    ;;
esac
