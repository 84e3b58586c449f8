#!/usr/bin/env bash
# Connections nobody can starve, and many peers on one machine (real processes, loopback).
# Usage: test_crowd.sh HEARSAY CASE
#   idle     20 idle connections from the first peer's address (over its per-address limit) and
#            40 from other loopback addresses, held open against the first peer: a legitimate
#            peer (dialing from 127.0.0.1, not one of theirs: same16/same60 take its address)
#            still joins within its 5 s --join-timeout, and the strangers' refusals are logged at
#            most once a second
#   same16, same60
#            16 (the default --max-pending-per-addr) or 60 idle connections from the joiner's own
#            address, held open against the first peer: the joiner, whose first tries are
#            closed during the handshake without a reason, keeps trying until --join-timeout
#            (generous here: the test asserts that it joins, not how fast) and gets in
#   launch32 hearsay launch -n 32 on one machine: every peer finishes, 32 metrics files
# Every wait is bounded; everything started is killed by PID on exit.
set -uo pipefail
hs=$1
case=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
cleanup_extra() {
    # Peers started by a launcher carry the run directory in their arguments.
    pkill -9 -f "$tmp/" 2>/dev/null
}
net="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1))"
ip="$net.$(($$ % 200 + 2))"

case $case in
idle)
    small=(--insecure --synthetic --subset 2000 --test-subset 200 --batch 32 --rounds 60)
    "$hs" run --listen "$ip:7440" "${small[@]}" --wait-peers 2 >"$tmp/p0.out" 2>"$tmp/p0.err" &
    pids+=($!)
    for _ in $(seq 100); do grep -q "listening on" "$tmp/p0.err" && break; sleep 0.1; done
    others=()
    for i in $(seq 40); do others+=("127.$((RANDOM % 200 + 20)).$((RANDOM % 250)).$((i + 1)):1"); done
    /usr/bin/python3 "$here/hold.py" "$ip" 7440 "$ip:20" "${others[@]}" >"$tmp/hold.out" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do grep -q held "$tmp/hold.out" && break; sleep 0.1; done
    cat "$tmp/hold.out"
    # The joiner dials from 127.0.0.1 (the loopback's default source), not from the first 20
    # strangers' address.
    timeout 60 "$hs" run --listen "$ip:7441" --bootstrap "$ip:7440" --join-timeout 5000 "${small[@]}" \
        >"$tmp/p1.out" 2>"$tmp/p1.err"
    rc=$?
    [[ $rc -eq 0 ]] || fail "the joiner failed (exit $rc): $(tail -3 "$tmp/p1.err")"
    grep -q "joined as peer" "$tmp/p1.err" || fail "the joiner did not join: $(tail -3 "$tmp/p1.err")"
    refusals=$(grep -c "connection refused" "$tmp/p0.err")
    secs=$(awk '/connection refused/ { split($1, t, ":"); print t[1] * 3600 + t[2] * 60 + t[3] }' "$tmp/p0.err" |
        awk 'NR == 1 { a = $1 } { b = $1 } END { printf "%d", b - a + 1 }')
    echo "refusal lines: $refusals over ${secs:-0} s: $(grep "connection refused" "$tmp/p0.err" | head -2)"
    [[ $refusals -le $((secs + 1)) ]] || fail "$refusals refusal lines in $secs s: not throttled"
    echo "ok: joined despite 60 idle strangers: $(grep "joined as peer" "$tmp/p1.err")"
    ;;
same16 | same60)
    n=${case#same}
    small=(--insecure --synthetic --subset 2000 --test-subset 200 --batch 32 --rounds 30)
    "$hs" run --listen "$ip:7440" "${small[@]}" --wait-peers 2 >"$tmp/p0.out" 2>"$tmp/p0.err" &
    pids+=($!)
    for _ in $(seq 100); do grep -q "listening on" "$tmp/p0.err" && break; sleep 0.1; done
    # A peer dials from the loopback's default source, 127.0.0.1, whatever it listens on.
    /usr/bin/python3 "$here/hold.py" "$ip" 7440 "127.0.0.1:$n" >"$tmp/hold.out" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do grep -q held "$tmp/hold.out" && break; sleep 0.1; done
    cat "$tmp/hold.out"
    timeout 90 "$hs" run --listen "$ip:7441" --bootstrap "$ip:7440" --join-timeout 60000 \
        "${small[@]}" >"$tmp/p1.out" 2>"$tmp/p1.err"
    rc=$?
    grep -q "joined as peer" "$tmp/p1.err" || fail "the joiner did not join (exit $rc): $(tail -3 "$tmp/p1.err")"
    [[ $rc -eq 0 ]] || fail "the joiner failed (exit $rc): $(tail -3 "$tmp/p1.err")"
    grep -q "join request from 127.0.0.1:" "$tmp/p0.err" || fail "the joiner did not come from 127.0.0.1"
    # How long it took, from its first log line (a measure for issue 21's "within 5 s", not
    # asserted: the suite runs on a shared machine).
    took=$(awk '{ split($1, t, ":"); s = t[1] * 3600 + t[2] * 60 + t[3] }
        NR == 1 { a = s } /joined as peer/ { printf "%.1f", s - a; exit }' "$tmp/p1.err")
    echo "ok: joined despite $n idle strangers from its own address, ${took} s after its start: $(grep "joined as peer" "$tmp/p1.err")"
    ;;
launch32)
    timeout 600 "$hs" launch -n 32 --synthetic --subset 8000 --test-subset 200 --batch 32 --rounds 200 \
        --runs-dir "$tmp" --name crowd --no-plot --refresh 5 >"$tmp/out" 2>&1 &
    pids+=($!)
    wait "${pids[-1]}"
    rc=$?
    tail -3 "$tmp/out"
    [[ $rc -eq 0 ]] || fail "launch -n 32 exited $rc: $(grep -i "error\|fail\|refused" "$tmp/out" | head -5)"
    n=$(ls "$tmp"/crowd/peer-*.jsonl 2>/dev/null | wc -l)
    [[ $n -eq 32 ]] || fail "$n metrics files, expected 32"
    echo "ok: 32 peers on one machine"
    ;;
*)
    fail "unknown case $case"
    ;;
esac
