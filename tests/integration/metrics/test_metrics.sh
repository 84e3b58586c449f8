#!/usr/bin/env bash
# The metrics of sim (synchronous and SGP), train and a 3-peer `hearsay run` job on loopback
# follow docs/METRICS.md (every field documented for its command, with its type; the event on
# the last record only), and every progress line prints the loss and bytes of the JSON record
# of its round. Usage: test_metrics.sh HEARSAY CHECK_METRICS.PY METRICS.md. Every process is
# bounded and killed by PID.
set -uo pipefail
hs=$1
check=$2
doc=$3
py=/usr/bin/python3
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
data=(--synthetic --subset 600 --test-subset 200 --hidden 32 --batch 16)

timeout -s KILL 60 "$hs" sim -n 4 "${data[@]}" --rounds 30 --eval-every 10 \
    --metrics "$tmp/sim.jsonl" >"$tmp/sim.out" 2>&1 || fail "sim: $(tail -3 "$tmp/sim.out")"
"$py" "$check" "$doc" sim "$tmp/sim.jsonl" "$tmp/sim.out" \
    --want round,epoch,loss,test_acc,test_acc_min,consensus,bytes_sent,rounds_min || fail "sim"

timeout -s KILL 60 "$hs" sim -n 4 --algo sgp "${data[@]}" --rounds 30 --eval-every 10 \
    --slowdown 1:2 --metrics "$tmp/sgp.jsonl" >"$tmp/sgp.out" 2>&1 ||
    fail "sim sgp: $(tail -3 "$tmp/sgp.out")"
"$py" "$check" "$doc" sim "$tmp/sgp.jsonl" "$tmp/sgp.out" --want 'rounds_<i>' || fail "sim sgp"

timeout -s KILL 60 "$hs" train "${data[@]}" --epochs 2 --log-every 5 \
    --metrics "$tmp/train.jsonl" >"$tmp/train.out" 2>&1 || fail "train: $(tail -3 "$tmp/train.out")"
"$py" "$check" "$doc" train "$tmp/train.jsonl" "$tmp/train.out" \
    --want step,loss,lr,samples_per_s,train_time,test_acc || fail "train"

# run: the progress lines are log lines on stderr (at info, printed at each evaluation).
common=(--listen 127.0.0.1:0 --rendezvous "$tmp/rv" --insecure --run-id "metrics-$$"
    --peer-timeout 30000 --join-timeout 60000 --recv-timeout 60000 --world 3 --wait-peers 3
    "${data[@]}" --rounds 30 --eval-every 5 --algo sgp --lr 0.02 --on-divergence warn --metrics "$tmp/m{id}.jsonl")
for r in 0 1 2; do
    timeout -s KILL 120 "$hs" run --rank $r "${common[@]}" >"$tmp/p$r.out" 2>"$tmp/p$r.err" &
    pids+=($!)
done
for r in 0 1 2; do
    wait "${pids[$r]}" || fail "peer of rank $r exited $?: $(tail -3 "$tmp/p$r.err")"
done
for id in 0 1 2; do
    [[ -s $tmp/m$id.jsonl ]] || fail "peer $id wrote no metrics"
    err=$(grep -l "^[0-9:.]* peer $id info: starting at round" "$tmp"/p*.err) ||
        fail "no log of peer $id"
    "$py" "$check" "$doc" run "$tmp/m$id.jsonl" "$err" \
        --want peer,round,loss,bytes_sent,wire_bytes_sent,members,peers_dead,unix_time,push_weight,waits ||
        fail "run, peer $id"
done
echo "ok: sim, sgp sim, train and 3 run peers follow docs/METRICS.md; progress lines agree"
