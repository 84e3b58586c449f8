#!/usr/bin/env bash
# A whole job restarted with --resume and another --rounds than the job's: it goes on with the
# job's count, so its random compressor (QSGD, drawn by the round counted from the job's first
# round) draws as before, and it ends with the bits of the run that was never stopped. Two
# peers (D-PSGD, qsgd:16) run 12 rounds with a checkpoint every 5; both are then resumed from
# those checkpoints with --rounds 50 and must end with the same final parameters.
# Usage: test_rounds.sh HEARSAY. Every wait is bounded; every process is killed by PID.
set -uo pipefail
hs=$1
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
ip="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$(($$ % 250 + 2))"
port=$((7900 + RANDOM % 90))
common=(--insecure --synthetic --subset 2000 --test-subset 200 --batch 64 --world 2 --seed 7
    --algo dpsgd --compress qsgd:16 --checkpoint-every 5 --eval-every 1000)

# job NAME ROUNDS [ARGS...]: both peers, to their end.
job() {
    local name=$1 rounds=$2 r boot p
    shift 2
    local jp=()
    for r in 0 1; do
        boot=()
        [[ $r == 1 ]] && boot=(--bootstrap "$ip:$port")
        "$hs" run --listen "$ip:$((port + r))" "${boot[@]}" --rank $r --rounds "$rounds" \
            --checkpoint-dir "$tmp/ck$r" --save "$tmp/$name-$r.bin" "${common[@]}" "$@" \
            >"$tmp/$name-$r.out" 2>"$tmp/$name-$r.err" &
        jp+=($!)
        pids+=($!)
    done
    for p in "${jp[@]}"; do
        timeout 60 tail --pid="$p" -f /dev/null || fail "$name: a peer did not finish"
        wait "$p" || fail "$name: a peer failed: $(tail -n 3 "$tmp/$name"-*.err)"
    done
}

job full 12
ls "$tmp"/ck0/ckpt-0-*.hsck >/dev/null 2>&1 || fail "no checkpoint written: $(ls "$tmp/ck0")"
job resumed 50 --resume
for r in 0 1; do
    grep -q "resumed model and optimizer" "$tmp/resumed-$r.err" ||
        fail "peer $r did not resume: $(tail -n 5 "$tmp/resumed-$r.err")"
    grep -h "starting at round" "$tmp/full-$r.err" "$tmp/resumed-$r.err"
    cmp -s "$tmp/full-$r.bin" "$tmp/resumed-$r.bin" ||
        fail "peer $r: resumed with --rounds 50 in a job of 12, it ended elsewhere than the run that went through"
done
echo "ok: resumed with another --rounds, the job's count kept: the uninterrupted run's bits"
