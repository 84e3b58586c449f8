#!/usr/bin/env bash
# Resume that resumes (real processes on loopback). Usage: test_resume.sh HEARSAY CASE
#   lone   one peer killed with SIGKILL 10 times at random moments and resumed each time: its
#          round never goes back by more than one checkpoint interval, and it finishes
#   job    a whole job of 3 stopped with SIGTERM (checkpoints) and restarted with --resume on
#          the same addresses: it continues from the checkpoint round and ends within 1 point
#          of the accuracy of an undisturbed run
#   paths  an unusable --checkpoint-dir or --save directory is refused before training (exit 2)
# Every wait is bounded; every process started is killed by PID on exit.
set -uo pipefail
hs=$1
case=$2
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
ip="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$(($$ % 250 + 2))"
small=(--synthetic --subset 4000 --test-subset 500 --batch 64)


case $case in
lone)
    K=20
    args=(--listen "$ip:7410" --insecure "${small[@]}" --rounds 3000 --checkpoint-dir "$tmp/ck"
        --checkpoint-every $K --eval-every 1000 --metrics "$tmp/m.jsonl")
    resume=()
    prev=0
    for kill_no in $(seq 10); do
        : >"$tmp/err"
        "$hs" run "${args[@]}" "${resume[@]}" >"$tmp/out" 2>"$tmp/err" &
        pid=$!
        pids+=($pid)
        wait_for 60 started "$tmp/err" || fail "run $kill_no did not start: $(tail -5 "$tmp/err")"
        start=$(sed -n 's/.*starting at round \([0-9]*\),.*/\1/p' "$tmp/err" | head -1)
        echo "run $kill_no: starts at round $start (killed last after round $prev)"
        [[ $start -ge $((prev - K)) ]] || fail "round went back from $prev to $start (> $K)"
        # A random moment past the next checkpoint: progress must survive the kill.
        target=$((start + K + RANDOM % (2 * K)))
        wait_for 60 bash -c "[[ \$(grep -o '\"round\":[0-9]*' '$tmp/m.jsonl' | tail -1 | cut -d: -f2) -ge $target ]]" ||
            fail "run $kill_no made no progress to round $target: $(tail -3 "$tmp/err")"
        kill -9 "$pid"
        wait "$pid" 2>/dev/null
        prev=$(last_round "$tmp/m.jsonl")
        resume=(--resume)
        ls "$tmp"/ck/.*.tmp >/dev/null 2>&1 && echo "(a temporary was left by the kill)"
    done
    # The last one runs to the end.
    "$hs" run "${args[@]}" --resume --rounds 3000 >"$tmp/out" 2>"$tmp/err" &
    pid=$!
    pids+=($pid)
    wait_for 60 started "$tmp/err" || fail "the last run did not start"
    start=$(sed -n 's/.*starting at round \([0-9]*\),.*/\1/p' "$tmp/err" | head -1)
    [[ $start -ge $((prev - K)) ]] || fail "round went back from $prev to $start (> $K)"
    timeout 300 tail --pid="$pid" -f /dev/null || fail "the last run did not finish"
    wait "$pid" || fail "the last run failed: $(tail -5 "$tmp/err")"
    grep -q '^final: peer' "$tmp/out" || fail "no final line: $(cat "$tmp/out")"
    ls "$tmp"/ck/.*.tmp >/dev/null 2>&1 && fail "a stale temporary is still there: $(ls -a "$tmp/ck")"
    echo "ok: 10 kills, the round never went back more than $K; $(cat "$tmp/out")"
    ;;
job)
    printf 'resume-job-test-secret-0123456789ab' >"$tmp/secret"
    chmod 600 "$tmp/secret"
    common=(--secret-file "$tmp/secret" "${small[@]}" --rounds 600 --world 3 --checkpoint-every 50
        --eval-every 600 --seed 3)
    # start NAME: 3 peers, rank 0 first, the others through it, all waiting for the 3.
    start_job() {
        local name=$1 i boot
        shift
        jp=()
        for i in 0 1 2; do
            boot=()
            [[ $i -gt 0 ]] && boot=(--bootstrap "$ip:7420")
            "$hs" run --listen "$ip:$((7420 + i))" "${boot[@]}" --rank $i --wait-peers 3 \
                --checkpoint-dir "$tmp/$name-ck$i" "${common[@]}" "$@" \
                --metrics "$tmp/$name-m$i.jsonl" >>"$tmp/$name-p$i.out" 2>>"$tmp/$name-p$i.err" &
            jp+=($!)
            pids+=($!)
        done
    }
    finish_job() {
        local p
        for p in "${jp[@]}"; do
            timeout 300 tail --pid="$p" -f /dev/null || fail "a peer did not finish"
            wait "$p" || fail "a peer of $1 failed: $(tail -n 5 "$tmp"/$1-p*.err)"
        done
    }
    acc() { sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' "$1" | tail -1; }
    # The undisturbed run.
    start_job plain
    finish_job plain
    # The same, stopped with SIGTERM once past round 200, then resumed on the same addresses.
    start_job cut
    wait_for 120 bash -c "[[ \$(grep -o '\"round\":[0-9]*' '$tmp/cut-m0.jsonl' 2>/dev/null | tail -1 | cut -d: -f2) -ge 200 ]]" ||
        fail "no progress: $(tail -3 "$tmp/cut-p0.err")"
    for p in "${jp[@]}"; do kill -TERM "$p"; done
    for p in "${jp[@]}"; do
        timeout 60 tail --pid="$p" -f /dev/null || fail "a peer did not stop on SIGTERM"
        wait "$p" || fail "a peer failed on SIGTERM: $(tail -n 5 "$tmp"/cut-p*.err)"
    done
    stopped=$(last_round "$tmp/cut-m0.jsonl")
    start_job cut --resume
    finish_job cut
    for i in 0 1 2; do
        from=$(sed -n 's/.*resuming from .*(round \([0-9]*\)).*/\1/p' "$tmp/cut-p$i.err" | tail -1)
        at=$(sed -n 's/.*starting at round \([0-9]*\),.*/\1/p' "$tmp/cut-p$i.err" | tail -1)
        [[ -n $from && -n $at ]] || fail "peer $i did not resume: $(tail -5 "$tmp/cut-p$i.err")"
        echo "peer $i: stopped near round $stopped, resumed from its checkpoint of round $from, ran from round $at"
        [[ $at -ge $from && $from -ge $((stopped - 50)) ]] ||
            fail "peer $i continued from round $at, its checkpoint was of round $from (stopped at $stopped)"
        a=$(acc "$tmp/plain-p$i.out")
        b=$(acc "$tmp/cut-p$i.out")
        echo "peer $i: accuracy undisturbed $a%, stopped and resumed $b%"
        awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1.0) }' ||
            fail "peer $i: accuracy $b% is more than 1 point from the undisturbed $a%"
    done
    echo "ok: the job resumed from its checkpoints"
    ;;
paths)
    : >"$tmp/file"
    timeout 30 "$hs" run --insecure "${small[@]}" --rounds 5 --checkpoint-dir "$tmp/file/ck" >"$tmp/out" 2>&1
    rc=$?
    [[ $rc -eq 2 ]] || fail "unusable --checkpoint-dir: exit $rc, expected 2: $(cat "$tmp/out")"
    grep -q "checkpoint-dir $tmp/file/ck" "$tmp/out" || fail "the reason does not name the directory: $(cat "$tmp/out")"
    timeout 30 "$hs" run --insecure "${small[@]}" --rounds 5 --save "$tmp/nodir/model-{id}.bin" >"$tmp/out" 2>&1
    rc=$?
    [[ $rc -eq 2 ]] || fail "unusable --save: exit $rc, expected 2: $(cat "$tmp/out")"
    grep -q "does not exist" "$tmp/out" || fail "no reason: $(cat "$tmp/out")"
    echo "ok: both refused before training: $(cat "$tmp/out")"
    ;;
*)
    fail "unknown case $case"
    ;;
esac
