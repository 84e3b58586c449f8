#!/usr/bin/env bash
# A peer frozen until every other member is gone never trains alone (real processes, loopback;
# issue 21, point 1). Usage: test_alone.sh HEARSAY
#
# 4 peers (D-PSGD on a ring). Once the job trains, the last one to start is frozen with SIGSTOP
# and kept frozen until the other 3 have exited: they declare it dead (silence past the peer
# timeout), remove it, train the job's rounds to its end and exit 0, as they always did.
# Continued, it finds every other member gone (their ports refuse). It cannot tell a job that
# removed it and finished from members that crashed, and nobody is left to let it in again: it
# must stop with a non-zero status saying so, not train the job's remaining rounds alone and
# exit 0 (as it did before). Nothing here depends on how fast anything runs: the others cannot
# finish before they declared it dead, so it was stopped for over a peer timeout. Every wait is
# bounded; every process started is killed by PID on exit (a frozen one continued first).
set -uo pipefail
hs=$1
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
cleanup_pid() { kill -CONT "$1" 2>/dev/null; }
fail_extra() {
    for f in "$tmp"/e*; do echo "--- $f"; grep -v "round [0-9]*/" "$f" | tail -12; done
}
rounds=100
ip="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$(($$ % 250 + 2))"
# A generous peer timeout, so that a loaded machine does not have a running peer declared dead.
common=(--insecure --synthetic --subset 2000 --test-subset 200 --batch 32 --algo dpsgd
    --rounds $rounds --world 4 --wait-peers 4 --peer-timeout 3000 --eval-every 1000
    --on-divergence warn)
start() { # start I [ARGS...]: peer I (rank I), listening on port 7680+I
    local i=$1
    shift
    "$hs" run --listen "$ip:$((7680 + i))" --rank "$i" "$@" "${common[@]}" \
        --metrics "$tmp/m$i.jsonl" >"$tmp/o$i" 2>"$tmp/e$i" &
    pids[$i]=$!
}
start 0
wait_for 30 grep -q "listening on" "$tmp/e0" || fail "peer 0 did not start"
for i in 1 2 3; do start "$i" --bootstrap "$ip:7680"; done
for i in 0 1 2 3; do wait_for 60 started "$tmp/e$i" || fail "process $i did not start"; done
kill -STOP "${pids[3]}"
fid=$(sed -n 's/.*joined as peer \([0-9]*\) .*/\1/p' "$tmp/e3" | head -1)
[[ -n $fid ]] || fail "process 3 did not say which peer it is"

# The other 3: exit 0 at the job's end, having removed the frozen peer.
for i in 0 1 2; do
    timeout 90 tail --pid="${pids[$i]}" -f /dev/null || fail "process $i still running after 90 s"
    wait "${pids[$i]}" || fail "process $i exited $?: $(tail -2 "$tmp/e$i")"
    read -r first end < <(sed -n 's/^final: .*, rounds \([0-9]*\)\.\.\([0-9]*\),.*/\1 \2/p' "$tmp/o$i")
    [[ -n ${end:-} && $((end - first)) -eq $rounds ]] ||
        fail "process $i ran rounds ${first:-?}..${end:-?}, not the job's $rounds"
done
grep -q "peer $fid ([^)]*) is no longer a member" "$tmp/e0" "$tmp/e1" "$tmp/e2" ||
    fail "the others did not remove the frozen peer $fid"

kill -CONT "${pids[3]}"
timeout 60 tail --pid="${pids[3]}" -f /dev/null || fail "the frozen peer still runs 60 s after waking"
wait "${pids[3]}"
rc=$?
[[ $rc -ne 0 ]] || fail "the frozen peer exited 0: $(cat "$tmp/o3")"
grep -q '^final:' "$tmp/o3" && fail "the frozen peer printed a final line: $(cat "$tmp/o3")"
# The verdict comes once those it could still reach are no majority: 2 or 3 of 4 found gone.
why="hearsay run: peer $fid: this peer was stopped .* for [0-9]+ ms.* to find (every other member"
why+=" of the job|[23] of the job's 4 members) gone meanwhile \\(peer [0-9]+ gone, peer [0-9]+ gone"
why+=".*: it cannot get back into the job"
grep -Eq "$why" "$tmp/e3" ||
    fail "the frozen peer exited $rc without saying why it stops: $(tail -3 "$tmp/e3")"
last=$(last_round "$tmp/m3.jsonl")
[[ $last -gt 0 ]] || fail "the frozen peer recorded no round"
[[ $last -lt $end ]] || fail "the frozen peer trained alone to round $last (the job ended at $end)"
echo "PASS: the others removed peer $fid and ended at round $end; woken, it stopped at round" \
    "$last with status $rc: $(sed -n 's/^hearsay run: //p' "$tmp/e3")"
