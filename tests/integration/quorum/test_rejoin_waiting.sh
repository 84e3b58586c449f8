#!/usr/bin/env bash
# A peer removed and let in again while the job still waits for its first members ends with the
# job (real processes, loopback). Usage: test_rejoin_waiting.sh HEARSAY
#
# The job waits for 4 peers. The first peer (the sequencer) lets the 4th in, so its own wait is
# over and it starts; its frames leave 2 s late (--emulate), and it is frozen before the list
# with 4 members reaches peers 1 and 2, who wait on with 3. The 4th is killed. Peers 1 and 2
# declare the frozen one dead and remove it; woken, it learns that and joins again through
# peer 1, whose terms have no end yet (it still waits). A 5th peer then completes the 4.
# Every peer must run the job's rounds and end at the same round: the one let in again used to
# take "no end" for its terms and train for ever (alone once the others had finished).
set -uo pipefail
hs=$1
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
cleanup_pid() { kill -CONT "$1" 2>/dev/null; } # a frozen peer is resumed before it is killed
fail_extra() {
    for f in "$tmp"/e*; do echo "--- $f"; grep -v "round [0-9]*/" "$f" | tail -12; done
}
rounds=40
ip="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$(($$ % 250 + 2))"
common=(--insecure --algo sgp --staleness 0 --synthetic --subset 2000 --test-subset 100
    --batch 32 --rounds $rounds --world 4 --wait-peers 4 --peer-timeout 5000
    --join-timeout 30000 --on-divergence warn)
start() { # start I [ARGS...]: process I, listening on port 7650+I
    local i=$1
    shift
    "$hs" run --listen "$ip:$((7650 + i))" "$@" "${common[@]}" >"$tmp/o$i" 2>"$tmp/e$i" &
    pids[$i]=$!
}
has() { grep -Eq "$1" "${@:2}" 2>/dev/null; }
both() { has "$1" "$tmp/e1" && has "$1" "$tmp/e2"; }
either() { has "$1" "$tmp/e1" || has "$1" "$tmp/e2"; }

start 0 --emulate delay=2000ms
wait_for 30 grep -q "listening on" "$tmp/e0" || fail "peer 0 did not start"
start 1 --bootstrap "$ip:7650"
start 2 --bootstrap "$ip:7650"
wait_for 30 both "3 peers \[0 1 2\]" || fail "peers 1 and 2 did not join"
# The list of 3 agreed, as the first peer's (late) heartbeats tell: then 2 of the 3 may remove it.
sleep 4
start 3 --bootstrap "$ip:7650"
for _ in $(seq 3000); do has "starting at round" "$tmp/e0" && break; sleep 0.01; done
kill -STOP "${pids[0]}"
kill -9 "${pids[3]}"
either "4 peers \\[" && fail "the list of 4 reached peers 1 and 2 before the first peer froze"
wait_for 30 either "members v[0-9]+ .*: 2 peers \[1 2\]" || fail "peers 1 and 2 did not remove peer 0"
kill -CONT "${pids[0]}"
wait_for 30 has "joined as peer" "$tmp/e0" || fail "peer 0 did not join again"
either "starting at round" && fail "peers 1 and 2 started with 3 members"
start 4 --bootstrap "$ip:7651"
ends=()
for i in 0 1 2 4; do
    timeout 60 tail --pid="${pids[$i]}" -f /dev/null || fail "process $i still running after 60 s"
    wait "${pids[$i]}" || fail "process $i exited $?: $(tail -2 "$tmp/e$i")"
    read -r first end < <(sed -n 's/^final: .*, rounds \([0-9]*\)\.\.\([0-9]*\),.*/\1 \2/p' "$tmp/o$i")
    [[ -n ${end:-} && $((end - first)) -eq $rounds ]] ||
        fail "process $i ran rounds ${first:-?}..${end:-?}, not $rounds: $(cat "$tmp/o$i")"
    ends+=("$end")
done
[[ $(printf '%s\n' "${ends[@]}" | sort -u | wc -l) -eq 1 ]] || fail "the peers ended at rounds ${ends[*]}"
grep -q "joined again before the job's first round" "$tmp/e0" ||
    fail "the peer let in again did not say where it starts"
echo "PASS: the peer let in again waited with the job; 4 peers ran rounds ..${ends[0]}"
