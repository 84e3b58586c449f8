#!/usr/bin/env bash
# The compressor/algorithm rules and CHOCO's automatic consensus step, through the real binary.
# Usage: test_choco_defaults.sh HEARSAY CASE [EXTRA SIM OPTIONS...]
#   refusals     every combination that cannot work exits 2, before loading data, with its reason
#   accepted     every accepted compressor trains with CHOCO on the synthetic set: the loss falls,
#                nothing is NaN
#   long-run-N   the defaults on a ring of N peers with top-1% for 5,000 rounds: the consensus
#                distance does not grow over the last 1,000 rounds and the final accuracy is within
#                1 point of the best (EXTRA options, e.g. --gamma-c 0.1, show the check can fail)
#   long-run-default-N  the same with CHOCO's defaults (sign:512 and local momentum)
#   small-graphs  the defaults on the complete graphs of 2, 3 and 4 peers (spectral gap 1: the
#                largest automatic step) for 800 rounds, where the loss goes to ~1e-4 and only
#                the consensus dynamics are left: the guard never stops them and every run ends
#                above 95% (sign:512 with hybrid momentum is stopped at rounds 104-120 here:
#                docs/RESULTS.md, "sign:512 after a resume")
#   momentum-default  CHOCO's default is sign:512 at its automatic step with local momentum, the
#                pair measured for the default (hybrid or qg with sign:512 diverges on small
#                graphs); every run keeps local momentum unless --momentum-kind asks otherwise
# Every command is bounded by `timeout`; nothing runs in the background.
set -uo pipefail
hs=$1
case=$2
shift 2
extra=("$@")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
    echo "FAIL: $*"
    exit 1
}

# refuse ALGO COMPRESS WORD...: exit 2 and every WORD in the message; --data points nowhere, so
# a refusal that came after loading data would fail on the missing dataset instead.
refuse() {
    local algo=$1 comp=$2
    shift 2
    timeout 30 "$hs" sim -n 4 --algo "$algo" --compress "$comp" --data "$tmp/none" >"$tmp/out" 2>&1
    local rc=$?
    [[ $rc -eq 2 ]] || fail "$algo $comp: exit $rc, expected 2: $(cat "$tmp/out")"
    for w in "$@"; do
        grep -qF -- "$w" "$tmp/out" || fail "$algo $comp: no '$w' in: $(cat "$tmp/out")"
    done
    echo "ok: refused $algo $comp: $(head -1 "$tmp/out")"
}

case $case in
refusals)
    refuse choco randk:0.01 "contraction" "randk:0.01:unscaled" "topk:0.01"
    refuse choco randk:500:fp16 "contraction" "randk:500:unscaled"
    refuse choco ef:topk:0.01 "already compensates" "--compress topk:0.01"
    refuse sgp ef:topk:0.1 "mass" "--compress topk:0.1"
    refuse dpsgd topk:0.1 "drops information" "--algo choco" "ef:topk:0.1"
    refuse dpsgd sign "drops information" "ef:sign"
    refuse dpsgd randk:0.1:unscaled "drops information"
    refuse dcd topk:0.01 "unbiased"
    refuse dcd ef:qsgd:16 "unbiased"
    # What stays allowed: lossy casts with D-PSGD, ef: with D-PSGD, unbiased ones with DCD.
    for spec in "dpsgd fp16" "dpsgd bf16" "dpsgd ef:topk:0.1" "dcd randk:0.1" "sgp topk:0.1"; do
        set -- $spec
        timeout 60 "$hs" sim -n 4 --algo "$1" --compress "$2" --synthetic --subset 1000 \
            --test-subset 200 --rounds 3 --quiet >"$tmp/out" 2>&1 ||
            fail "$1 $2 refused: $(cat "$tmp/out")"
    done
    echo "ok: dpsgd fp16/bf16/ef:topk, dcd randk, sgp topk accepted"
    ;;
accepted)
    for comp in none fp16 bf16 topk:0.05 topk:500 topk:0.05:fp16 randk:0.05:unscaled \
        randk:0.05:fp16:unscaled qsgd:16 qsgd:4:64 sign sign:256; do
        timeout 120 "$hs" sim -n 4 --algo choco --compress "$comp" --synthetic --subset 2000 \
            --test-subset 500 --hidden 32 --batch 32 --rounds 120 --eval-every 20 \
            --metrics "$tmp/m.jsonl" >"$tmp/out" 2>&1 || fail "$comp: $(tail -3 "$tmp/out")"
        grep -qi "nan" "$tmp/m.jsonl" && fail "$comp: NaN in the metrics: $(cat "$tmp/m.jsonl")"
        first=$(grep '"loss"' "$tmp/m.jsonl" | head -1 | sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p')
        last=$(grep '"loss"' "$tmp/m.jsonl" | tail -1 | sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p')
        step=$(sed -n 's/.*gamma_c = \([0-9.e+-]*\).*/\1/p' "$tmp/out")
        [[ -n $first && -n $last && -n $step ]] || fail "$comp: no loss or gamma_c: $(cat "$tmp/out")"
        awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.8 * a) }' ||
            fail "$comp: loss $first -> $last did not fall"
        echo "ok: choco $comp (gamma_c $step): loss $first -> $last"
    done
    ;;
momentum-default)
    # kind FLAGS...: the momentum kind a one-round sim with FLAGS says it runs ("quasi-global",
    # "hybrid"; nothing for local momentum), its start line kept in $tmp/out.
    kind() {
        timeout 60 "$hs" sim -n 4 --synthetic --subset 400 --test-subset 100 --hidden 8 \
            --rounds 1 "$@" >"$tmp/out" 2>&1 || fail "$*: $(tail -3 "$tmp/out")"
        sed -n 's/^hearsay sim: \([a-z-]*\) .*momentum, beta .*/\1/p' "$tmp/out"
    }
    # step: the automatic consensus step and the compressor it was computed for, as printed.
    step() { sed -n 's/.*gamma_c = \([0-9.]*\) (automatic: .* for \([^,]*\), .*/\1 \2/p' "$tmp/out"; }
    [[ -z $(kind) ]] || fail "the defaults do not run local momentum: $(cat "$tmp/out")"
    dflt=$(step)
    [[ $dflt == *" sign:512" ]] || fail "the default compressor is not sign:512: $(cat "$tmp/out")"
    [[ -z $(kind --compress sign:512) && $(step) == "$dflt" ]] ||
        fail "sign:512 given: not the defaults' momentum and step ($dflt): $(cat "$tmp/out")"
    for flags in "--compress topk:0.05:fp16" "--compress topk:0.01" "--algo dpsgd" \
        "--momentum 0" "--optimizer adamw" "--outer-lr 1" "--algo beer"; do
        [[ -z $(kind $flags) ]] || fail "$flags: $(kind $flags) momentum, expected local"
    done
    [[ $(kind --momentum-kind qg) == quasi-global ]] || fail "--momentum-kind qg: $(cat "$tmp/out")"
    [[ $(kind --momentum-kind hybrid) == hybrid ]] ||
        fail "--momentum-kind hybrid not run: $(cat "$tmp/out")"
    [[ $(kind --compress topk:0.05:fp16 --momentum-kind hybrid) == hybrid ]] ||
        fail "--momentum-kind hybrid not run with topk:0.05:fp16: $(cat "$tmp/out")"
    echo "ok: choco defaults to sign:512 (gamma_c ${dflt% *}) with local momentum; qg and hybrid when asked"
    ;;
small-graphs)
    for n in 2 3 4; do
        timeout 120 "$hs" sim -n "$n" --synthetic --subset 4000 --test-subset 500 --batch 64 \
            --rounds 800 --eval-every 800 "${extra[@]}" >"$tmp/out" 2>&1
        rc=$?
        [[ $rc -eq 0 ]] || fail "$n peers: exit $rc: $(grep -m1 'diverged\|error' "$tmp/out")"
        acc=$(sed -n 's/.*acc mean \([0-9.]*\)% min \([0-9.]*\)%.*/\2/p' "$tmp/out" | tail -1)
        awk -v a="$acc" 'BEGIN { exit !(a >= 95) }' || fail "$n peers: worst peer $acc% (< 95%)"
        echo "ok: $n peers, 800 rounds, worst peer $acc%: $(grep -o 'gamma_c = [0-9.]*' "$tmp/out")"
    done
    ;;
long-run-*)
    # 5,000 rounds on a small model (hidden 32, batch 16) to stay within a couple of minutes;
    # consensus every 10 rounds.
    n=${case#long-run-}
    comp=(--compress topk:0.01)
    if [[ $n == default-* ]]; then
        n=${n#default-}
        comp=()
    fi
    timeout 600 "$hs" sim -n "$n" --algo choco "${comp[@]}" --topology ring --synthetic \
        --subset 4000 --test-subset 500 --hidden 32 --batch 16 --rounds 5000 --eval-every 10 \
        --metrics "$tmp/m.jsonl" "${extra[@]}" >"$tmp/out" 2>&1
    rc=$?
    grep 'gamma_c\|^final' "$tmp/out"
    [[ $rc -eq 0 ]] || fail "exit $rc: $(tail -3 "$tmp/out")"
    # Bounded: the largest distance over rounds 4000-5000 is at most twice the largest over
    # 3000-4000 (geometric growth of 0.07% per round or more doubles it), and finite.
    awk -F'[{}:,]' '
        { for (i = 1; i < NF; i++) { if ($i == "\"round\"") r = $(i + 1); if ($i == "\"consensus\"") c = $(i + 1);
                                     if ($i == "\"test_acc\"") a = $(i + 1) } }
        c != c + 0 || c == "nan" || c == "inf" { bad = 1 }
        r > 3000 && r <= 4000 && c > w1 { w1 = c }
        r > 4000 && c > w2 { w2 = c }
        a > best { best = a }
        { last = a }
        END {
            printf "consensus max over rounds 3000-4000 %.3g, 4000-5000 %.3g; accuracy best %.2f%%, final %.2f%%\n",
                   w1, w2, 100 * best, 100 * last
            if (bad || w2 > 2 * w1) { print "FAIL: the consensus distance grows"; exit 1 }
            if (last < best - 0.01) { print "FAIL: the final accuracy is more than 1 point below the best"; exit 1 }
        }' "$tmp/m.jsonl" || exit 1
    echo "ok: $n peers, 5000 rounds, bounded"
    ;;
*)
    fail "unknown case $case"
    ;;
esac
