#!/usr/bin/env bash
# hearsay launch -n 4 -- /usr/bin/python3 SCRIPT: the launcher runs 4 copies of a script that
# uses hearsay.Node with no placement option (they take RANK, WORLD_SIZE, MASTER_ADDR,
# MASTER_PORT and the run secret from the launcher), exits 0, and leaves the run directory
# (each rank's log, the nodes' metrics, the secret, summary.txt) whose peer ids are the ranks
# (rank-R.log and peer-R.jsonl are one process); a clean job logs no warning
# that a peer was cut off from it (at the start several peers join at once, at the end the
# sequencer leaves before the others: 4 peers on a ring, so the successor is not connected to
# every member); the nodes' metrics are plotted (when gnuplot is there). Then a job with no
# end, whose live view (not a terminal: a line every 10 refresh periods) shows both nodes:
# SIGINT to the launcher stops both copies (they exit on their own, not killed after the
# grace period) and the launcher exits 130.
# Usage: test_launch_script.sh HEARSAY (env: HEARSAY_LIB, HS_SOURCE_ROOT)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
need_python numpy
hs=$(realpath "$1")
cd "$tmp"
timeout 120 "$hs" launch -n 4 --master-addr "$ip" --runs-dir "$tmp/runs" --name ok -- \
    "$py" "$here/avg_peer.py" --value RANK --expect 1.5 algo=dpsgd rounds=20 >"$tmp/ok.out" 2>&1 ||
    fail "launch exited $?: $(cat "$tmp/ok.out") $(cat "$tmp"/runs/ok/rank-*.log)"
run=$tmp/runs/ok
# Every file and message names a peer by one number: peer ids follow the ranks, not the
# order in which the copies happened to reach rank 0 (issue 21).
for r in 0 1 2 3; do
    grep -q " rank $r rounds [0-9]* id $r$" "$run/rank-$r.log" ||
        fail "rank $r is not peer $r: $(grep -h ' rank [0-9]* rounds ' "$run"/rank-*.log)"
    grep -q "\"peer\": *$r[,}]" "$run/peer-$r.jsonl" || fail "peer-$r.jsonl is not peer $r's"
done
[[ -s $run/secret && -s $run/summary.txt ]] || fail "no secret or summary in $run: $(ls "$run")"
[[ $(ls "$run"/peer-*.jsonl | wc -l) == 4 ]] || fail "not 4 metrics files in $run: $(ls "$run")"
grep -q "listening on .*(secret" "$run/rank-0.log" ||
    fail "rank 0 did not use the run secret: $(grep listening "$run/rank-0.log")"
! grep -H "cut off" "$run"/rank-*.log || fail "a clean job logged a peer cut off from it"
if command -v gnuplot >/dev/null; then
    ls "$run"/plots/*.png >/dev/null 2>&1 || fail "no plots in $run: $(cat "$tmp/ok.out")"
else
    grep -q "no plots (gnuplot is not installed" "$tmp/ok.out" || fail "plots: $(cat "$tmp/ok.out")"
fi
echo "ok: hearsay launch -n 4 -- python script: exit 0, run directory $(ls "$run" | tr '\n' ' ')"

"$hs" launch -n 2 --master-addr "$ip" --runs-dir "$tmp/runs" --name int --grace 60 \
    --refresh 0.05 -- \
    "$py" "$here/avg_peer.py" --value RANK --expect 0.5 algo=dpsgd >"$tmp/int.out" 2>&1 &
launcher=$!
pids+=($launcher)
run=$tmp/runs/int
for _ in $(seq 600); do
    [[ $(ls "$run"/peer-*.jsonl 2>/dev/null | wc -l) == 2 ]] && break
    sleep 0.1
done
[[ $(ls "$run"/peer-*.jsonl 2>/dev/null | wc -l) == 2 ]] || fail "the 2 copies did not start rounds: $(cat "$tmp/int.out")"
for _ in $(seq 100); do
    grep -q "2/2 peers running, round [1-9]" "$tmp/int.out" && break
    sleep 0.1
done
grep -q "2/2 peers running, round [1-9]" "$tmp/int.out" || fail "no live view: $(cat "$tmp/int.out")"
children=$(pgrep -P "$launcher")
pids+=($children)
[[ $(echo $children | wc -w) == 2 ]] || fail "expected 2 children, got: $children"
kill -INT "$launcher"
timeout 60 tail --pid="$launcher" -f /dev/null || fail "the launcher did not end after SIGINT"
wait "$launcher"
st=$?
[[ $st == 130 ]] || fail "launcher exit status $st after SIGINT (want 130): $(cat "$tmp/int.out")"
for c in $children; do
    kill -0 "$c" 2>/dev/null && fail "child $c still runs"
done
grep -q "killed" "$tmp/int.out" && fail "a copy had to be killed: $(cat "$tmp/int.out")"
echo "ok: SIGINT stopped both copies, launcher exit 130"
