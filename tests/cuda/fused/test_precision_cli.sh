#!/usr/bin/env bash
# --precision on the command line: train, sim and launch accept fp32, tf32 and bf16; an
# unknown name, or tf32/bf16 with --device cpu, is refused with exit 2 and a message naming
# the problem, before any training (launch: before any peer starts); fp32 on the CPU trains.
# Needs no GPU.
#
#   test_precision_cli.sh HEARSAY_BINARY
set -uo pipefail

bin=$(realpath "${1:?usage: test_precision_cli.sh HEARSAY_BINARY}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

data=(--synthetic --subset 300 --test-subset 100)

# expect RC TEXT CMD...: CMD exits RC and its output contains TEXT.
expect() {
    local want_rc=$1 want=$2
    shift 2
    timeout 60 "$bin" "$@" >"$tmp/out" 2>&1
    local rc=$?
    if [[ $rc -ne $want_rc ]] || ! grep -q -- "$want" "$tmp/out"; then
        fail "$* exited $rc (expected $want_rc and '$want'):"
        cat "$tmp/out"
    else
        echo "ok: $*: $(grep -- "$want" "$tmp/out" | tail -n 1)"
    fi
}

for cmd in train sim; do
    expect 2 "unknown precision 'fp16' (expected fp32, tf32 or bf16)" $cmd --precision fp16 \
        "${data[@]}"
    expect 2 "--precision bf16 needs --device cuda" $cmd --precision bf16 "${data[@]}"
    expect 2 "--precision tf32 needs --device cuda" $cmd --device cpu --precision tf32 "${data[@]}"
    expect 0 "--precision P" $cmd --help
done
expect 2 "--precision bf16 needs --device cuda or --devices" launch -n 2 --precision bf16 \
    --no-plot --runs-dir "$tmp/runs" "${data[@]}"
compgen -G "$tmp/runs/*" >/dev/null && fail "launch started a run before refusing"
expect 0 "final: test accuracy" train --precision fp32 --epochs 1 --batch 50 "${data[@]}"
expect 0 "final" sim -n 2 --precision fp32 --rounds 2 --batch 50 "${data[@]}"

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
