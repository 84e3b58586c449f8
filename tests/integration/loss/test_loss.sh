#!/usr/bin/env bash
# A lost frame costs a round trip, not --recv-timeout (real processes on loopback). Usage:
# test_loss.sh HEARSAY. Four D-PSGD peers with --emulate loss=0.05 run 200 rounds with a
# --recv-timeout of 60 s, so that a round waiting for it would show. Asserted from what the
# peers decided (their metrics), never from wall-clock time: every peer finishes all rounds,
# the recovery path was taken (resend_asked > 0 in the job) and no recv() waited its whole
# timeout (recv_timeouts = 0 on every peer). Every process is bounded and killed by PID.
set -uo pipefail
hs=$1
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
fail_extra() { # the last lines of each peer's stderr after the FAIL line
    for i in 0 1 2 3; do echo "--- peer $i"; tail -n 5 "$tmp/p$i.err" 2>/dev/null; done
}
ip="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$(($$ % 250 + 2))"
port=$((7600 + RANDOM % 200))
rounds=200
common=(--insecure --synthetic --subset 4000 --test-subset 500 --batch 64 --algo dpsgd
    --rounds $rounds --world 4 --wait-peers 4 --eval-every 1000 --emulate loss=0.05
    --recv-timeout 60000 --seed 5)
for i in 0 1 2 3; do
    boot=()
    [[ $i -gt 0 ]] && boot=(--bootstrap "$ip:$port")
    timeout -s KILL 240 "$hs" run --listen "$ip:$((port + i))" "${boot[@]}" --rank $i \
        "${common[@]}" --metrics "$tmp/m$i.jsonl" >"$tmp/p$i.out" 2>"$tmp/p$i.err" &
    pids+=($!)
    [[ $i -eq 0 ]] && sleep 0.3 # the first peer listens before the others dial it
done
for i in 0 1 2 3; do
    wait "${pids[$i]}" || fail "peer $i exited with $?"
done
# field NAME LINE: an integer field of a JSON line.
field() { grep -o "\"$1\":[0-9]*" <<<"$2" | cut -d: -f2; }
asked=0
for i in 0 1 2 3; do
    # Round records only: the last record (with "event") repeats the counters.
    rounds_of() { grep '"resend_asked"' "$tmp/m$i.jsonl" | grep -v '"event"'; }
    last=$(rounds_of | tail -n 1)
    [[ -n $last ]] || fail "peer $i wrote no round with resend_asked"
    r=$(field round "$last")
    first=$(field round "$(rounds_of | head -n 1)")
    n=$(rounds_of | wc -l)
    [[ $n -eq $rounds ]] || fail "peer $i recorded $n rounds ($first..$r), want $rounds"
    to=$(field recv_timeouts "$last")
    [[ $to -eq 0 ]] || fail "peer $i: $to receives waited for the whole --recv-timeout"
    a=$(field resend_asked "$last")
    echo "peer $i: rounds $first..$r, resend_asked $a, recv_timeouts $to"
    asked=$((asked + a))
done
[[ $asked -gt 0 ]] || fail "no peer asked for a lost frame again (resend_asked = 0 everywhere)"
echo "ok: 4 peers, $rounds rounds at loss 0.05: $asked frames asked for again, no full timeout"
