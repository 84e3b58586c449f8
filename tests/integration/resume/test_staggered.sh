#!/usr/bin/env bash
# A job of 4 stopped in a staggered way (SIGTERM to rank 0, then to rank 1 once the job went on
# by two checkpoint intervals, and so on) and restarted with --resume, twice (issue 21 item 3):
# the job restarts at the newest round any peer reached (rank 3's, not rank 0's: rank 0 holds
# for the others and they agree on it); every peer starts each restart from a model at most
# one checkpoint interval older than the job's round (the shards behind take rank 3's from the
# shared checkpoint directory), never from one of a later round (of a timeline the job
# abandoned), and the files of an abandoned timeline are gone once the job restarted. Also: --resume without any
# checkpoint starts fresh with a notice; --resume=require exits 2.
# Usage: test_staggered.sh HEARSAY. Every wait is bounded; every process is killed by PID.
set -uo pipefail
hs=$1
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
ip="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$(($$ % 250 + 2))"
port=$((7500 + RANDOM % 400))
K=10
ck=$tmp/ck
args=(--insecure --synthetic --subset 4000 --test-subset 200 --batch 64 --rounds 100000
    --world 4 --checkpoint-dir "$ck" --checkpoint-every $K --eval-every 100000 --seed 5)

at_least() { [[ $(last_round "$1") -ge $2 ]]; }

# start_peer RUN RANK [--resume]: rank 0 listens on the job's address, the others join it.
declare -A pid
start_peer() {
    local run=$1 r=$2 boot=()
    shift 2
    [[ $r -gt 0 ]] && boot=(--bootstrap "$ip:$port")
    "$hs" run "${args[@]}" --listen "$ip:$((port + r))" "${boot[@]}" --rank "$r" \
        --metrics "$tmp/m$r.jsonl" "$@" >"$tmp/$run-p$r.out" 2>"$tmp/$run-p$r.err" &
    pid[$r]=$!
    pids+=($!)
}
restarting() { grep -q "no member of the checkpoint's job answers: restarting the job" "$1"; }
# start_job RUN [--resume]: resumed, rank 0 first and the others once it restarts the job (it
# holds for its members, and the job goes on from the newest round any of them reached).
start_job() {
    local run=$1 r
    shift
    start_peer "$run" 0 "$@"
    [[ $# -gt 0 ]] && { wait_for 60 restarting "$tmp/$run-p0.err" ||
        fail "$run: rank 0 did not restart the job: $(tail -3 "$tmp/$run-p0.err")"; }
    for r in 1 2 3; do start_peer "$run" $r "$@"; done
    for r in 1 2 3; do
        wait_for 60 started "$tmp/$run-p$r.err" || fail "$run: rank $r did not start: $(tail -3 "$tmp/$run-p$r.err")"
    done
}
# stop_staggered RUN: SIGTERM rank 0, then each next rank once the job went 2K rounds further.
stop_staggered() {
    local run=$1 r target
    for r in 0 1 2 3; do
        if [[ $r -gt 0 ]]; then
            target=$(($(last_round "$tmp/m$r.jsonl") + 2 * K))
            wait_for 60 at_least "$tmp/m$r.jsonl" $target ||
                fail "$run: rank $r made no progress to $target: $(tail -3 "$tmp/$run-p$r.err")"
        fi
        kill -TERM "${pid[$r]}"
        timeout 60 tail --pid="${pid[$r]}" -f /dev/null || fail "$run: rank $r did not stop"
        wait "${pid[$r]}" || fail "$run: rank $r failed on SIGTERM: $(tail -3 "$tmp/$run-p$r.err")"
        echo "$run: rank $r stopped after round $(last_round "$tmp/m$r.jsonl")"
    done
}
# check_resumed RUN: each peer's model at its first round is of a round in [start - K, start].
check_resumed() {
    local run=$1 r start from
    for r in 0 1 2 3; do
        start=$(sed -n 's/.*starting at round \([0-9]*\),.*/\1/p' "$tmp/$run-p$r.err" | head -1)
        if grep -q "the job is at round $start; .*taking the job's model" "$tmp/$run-p$r.err"; then
            echo "$run: rank $r starts at round $start with the job's model: $(grep -o 'no checkpoint.*' "$tmp/$run-p$r.err" | head -1)"
            continue
        fi
        from=$(sed -n 's/.*resuming from [^ ]* (round \([0-9]*\).*/\1/p' "$tmp/$run-p$r.err" | tail -1)
        [[ -n $from ]] || fail "$run: rank $r did not resume: $(tail -5 "$tmp/$run-p$r.err")"
        echo "$run: rank $r starts at round $start from its checkpoint of round $from"
        [[ $from -le $start ]] || fail "$run: rank $r runs round $start with its model of round $from (a later round: an abandoned timeline)"
        [[ $from -ge $((start - K)) ]] || fail "$run: rank $r went back from round $start to its checkpoint of round $from (more than $K)"
    done
}

mkdir -p "$ck"
# --resume with no checkpoint: a fresh start said in the log; =require refuses.
timeout 60 "$hs" run "${args[@]}" --world 1 --rounds 3 --listen "$ip:0" --resume=require \
    >"$tmp/req.out" 2>&1
rc=$?
[[ $rc -eq 2 ]] || fail "--resume=require without a checkpoint: exit $rc, expected 2: $(tail -3 "$tmp/req.out")"
grep -q "no valid checkpoint" "$tmp/req.out" || fail "no reason: $(tail -3 "$tmp/req.out")"
timeout 60 "$hs" run "${args[@]}" --world 1 --rounds 3 --listen "$ip:0" --checkpoint-dir "$tmp/ck1" \
    --resume >"$tmp/fresh.out" 2>&1 || fail "--resume without a checkpoint failed: $(tail -3 "$tmp/fresh.out")"
grep -q "no valid checkpoint.*starting without one" "$tmp/fresh.out" || fail "no notice: $(cat "$tmp/fresh.out")"
echo "ok: --resume without a checkpoint starts fresh, --resume=require exits 2"

start_job first
wait_for 60 at_least "$tmp/m0.jsonl" $((3 * K)) || fail "no progress: $(tail -3 "$tmp/first-p0.err")"
stop_staggered first
for run in second third; do
    before=$(cd "$ck" && for f in ckpt-*.hsck; do echo "$f $(stat -c %i "$f")"; done)
    start_job $run --resume
    check_resumed $run
    # The job goes on from the newest round any peer reached (rank 3's: it stopped last), not
    # from rank 0's (which stopped first): the members agree on it once they are all in.
    newest=$(sed -n 's/^ckpt-[0-9]*-0*\([0-9][0-9]*\)\.hsck .*/\1/p' <<<"$before" | sort -n | tail -1)
    for r in 0 1 2 3; do
        start=$(sed -n 's/.*starting at round \([0-9]*\),.*/\1/p' "$tmp/$run-p$r.err" | head -1)
        [[ $start == "$newest" ]] || fail "$run: rank $r starts at round $start, not at the newest checkpoint round $newest"
    done
    echo "$run: the job restarts at round $newest, the newest any peer reached"
    # Files of the abandoned timeline (of a later round than the job restarted from) are gone.
    r0=$(sed -n 's/.*starting at round \([0-9]*\),.*/\1/p' "$tmp/$run-p0.err" | head -1)
    while read -r f ino; do
        round=$((10#$(echo "$f" | sed 's/ckpt-[0-9]*-\([0-9]*\)\.hsck/\1/')))
        [[ $round -gt $r0 && -e $ck/$f && $(stat -c %i "$ck/$f") == "$ino" ]] &&
            fail "$run: $f (round $round) of the abandoned timeline is still there (the job restarted at $r0)"
    done <<<"$before"
    wait_for 60 at_least "$tmp/m0.jsonl" $((r0 + 2 * K)) || fail "$run: no progress"
    stop_staggered $run
done
echo "ok: two staggered stops and restarts: no peer older than $K rounds, no abandoned timeline"
