#!/usr/bin/env bash
# A peer resumed with another --rounds than the job's goes on with the job's count, so that its
# random compressor, drawn by the round counted from the job's first round, draws as the job's.
# Usage: test_rounds.sh HEARSAY CASE. Every wait is bounded; every process is killed by PID.
#   restart  a whole job restarted: two peers (D-PSGD, qsgd:16) run 12 rounds with a checkpoint
#            every 5; both are then resumed from those checkpoints with --rounds 50 (the first
#            restarts the job alone, from its checkpoint's count) and must end with the bits of
#            the run that was never stopped
#   rejoin   one peer of 3 (CHOCO, randk) stopped and resumed from its own checkpoint with
#            --rounds 50 into the running job (the WELCOME's count): no neighbour refuses its
#            messages ("stream check": random-k indices drawn for another round), nor it theirs
set -uo pipefail
hs=$1
case=$2
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

rejoin() {
    local r boot args=(--insecure --synthetic --subset 2000 --test-subset 200 --batch 64 --world 3
        --seed 7 --algo choco --compress randk:0.1:unscaled --checkpoint-every 100000
        --eval-every 100000)
    declare -A p
    # run R NAME [ARGS...]: rank R of a job of 100000 rounds, through rank 0.
    run() {
        local r=$1 name=$2 boot=()
        shift 2
        [[ $r -gt 0 ]] && boot=(--bootstrap "$ip:$port")
        "$hs" run --listen "$ip:$((port + r))" "${boot[@]}" --rank "$r" --checkpoint-dir "$tmp/ck$r" \
            --metrics "$tmp/$name.jsonl" "${args[@]}" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
        p[$name]=$!
        pids+=($!)
    }
    for r in 0 1 2; do run $r p$r --rounds 100000; done
    # Stopped with its checkpoint (SIGTERM) once training: however far the job goes on before
    # the peer is back, it stays within one (100000-round) interval of that checkpoint, so the
    # peer goes on from its own model under the WELCOME's terms.
    wait_for 60 bash -c "[[ \$(grep -o '\"round\":[0-9]*' '$tmp/p2.jsonl' 2>/dev/null | tail -1 | cut -d: -f2) -ge 20 ]]" ||
        fail "rank 2 did not train: $(tail -n 3 "$tmp/p2.err")"
    kill -TERM "${p[p2]}"
    timeout 60 tail --pid="${p[p2]}" -f /dev/null || fail "rank 2 did not stop on SIGTERM"
    ls "$tmp"/ck2/ckpt-2-*.hsck >/dev/null 2>&1 || fail "no checkpoint of rank 2: $(tail -n 3 "$tmp/p2.err")"
    run 2 back --rounds 50 --resume
    wait_for 60 started "$tmp/back.err" || fail "the resumed peer did not start: $(tail -n 5 "$tmp/back.err")"
    grep -q "resumed model and optimizer" "$tmp/back.err" ||
        fail "the resumed peer did not go on from its checkpoint: $(grep -m2 -- --resume "$tmp/back.err")"
    local from
    from=$(sed -n 's/.*starting at round \([0-9]*\),.*/\1/p' "$tmp/back.err" | head -1)
    wait_for 60 bash -c "[[ \$(grep -o '\"round\":[0-9]*' '$tmp/back.jsonl' 2>/dev/null | tail -1 | cut -d: -f2) -ge $((from + 30)) ]]" ||
        fail "the resumed peer ran no 30 rounds from round $from: $(tail -n 3 "$tmp/back.err")"
    grep -h "starting at round\|--rounds 50" "$tmp/back.err"
    if grep -q "stream check" "$tmp/p0.err" "$tmp/p1.err" "$tmp/back.err"; then
        grep -m3 -h "stream check" "$tmp/p0.err" "$tmp/p1.err" "$tmp/back.err"
        fail "random-k messages refused: the resumed peer draws for other rounds than the job"
    fi
    echo "ok: resumed with --rounds 50 into a running job of 100000: the job's count, no message refused"
}

case $case in
rejoin)
    rejoin
    exit 0
    ;;
restart) ;;
*) fail "unknown case $case" ;;
esac
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
