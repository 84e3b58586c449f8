#!/usr/bin/env bash
# The convergence guard through the real binary: a CHOCO run whose consensus step is outside the
# stable region (top-1% on a ring, gamma_c 0.4) stops with exit status 3 before its accuracy
# collapses, in the simulator and through `hearsay launch` (real processes on loopback); a
# non-finite loss stops even under --on-divergence warn. Usage: test_guard.sh HEARSAY CASE.
# Every command is bounded by `timeout` or a deadline; processes started are killed by PID.
set -uo pipefail
hs=$1
case=$2
data=/usr/share/datasets/fashion-mnist
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
cleanup_pid() {
    # The launcher's peers first (its children), then (common.sh) the launcher itself.
    for c in $(pgrep -P "$1" 2>/dev/null); do kill -9 "$c" 2>/dev/null; done
}
need_data() {
    [[ -f $data/train-images-idx3-ubyte.gz ]] || {
        echo "skip: $data not installed (package dataset-fashion-mnist)"
        exit 77
    }
}
py=/usr/bin/python3
[[ -x $py ]] || { echo "skip: $py not installed"; exit 77; }

# check_metrics FILE: the last line is the diverged record with a reason and a round, and no
# accuracy measured before it fell below half of the best one.
check_metrics() {
    $py - "$1" <<'PY' || fail "metrics $1: $(tail -2 "$1")"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
last = lines[-1]
assert last.get("event") == "diverged", "last record is not the diverged event: %r" % last
assert last.get("reason") and last.get("round", 0) > 0, "no reason or round: %r" % last
accs = [l["test_acc"] for l in lines if "test_acc" in l and l["test_acc"] == l["test_acc"]]
assert len(accs) >= 3, "too few accuracy records: %d" % len(accs)
best = max(accs)
assert min(accs[accs.index(best):]) >= 0.5 * best, "accuracy fell from %.3f to %.3f" % (
    best, min(accs[accs.index(best):]))
print("%s: stopped at round %g, best accuracy %.3f, last %.3f: %s" % (
    sys.argv[1].split("/")[-1], last["round"], best, accs[-1], last["reason"]))
PY
}

case $case in
sim-diverges)
    need_data
    timeout 600 "$hs" sim -n 8 --algo choco --compress topk:0.01 --gamma-c 0.4 --topology ring \
        --test-subset 1000 --eval-every 5 --quiet --metrics "$tmp/m.jsonl" >"$tmp/out" 2>&1
    rc=$?
    cat "$tmp/out"
    [[ $rc -eq 3 ]] || fail "exit $rc, expected 3"
    grep -q "^hearsay sim: diverged at round [0-9]*: the consensus distance grew" "$tmp/out" ||
        fail "no reason on stderr"
    grep -q -- "--gamma-c (now 0.4; try 0.2)" "$tmp/out" || fail "the advice does not name --gamma-c"
    check_metrics "$tmp/m.jsonl"
    ;;
sim-warn)
    # warn: the same run is reported once and goes on to the end (shortened), exit 0.
    need_data
    timeout 600 "$hs" sim -n 8 --algo choco --compress topk:0.01 --gamma-c 0.4 --topology ring \
        --test-subset 500 --rounds 260 --quiet --on-divergence warn --metrics "$tmp/m.jsonl" \
        >"$tmp/out" 2>&1
    rc=$?
    cat "$tmp/out"
    [[ $rc -eq 0 ]] || fail "exit $rc, expected 0"
    [[ $(grep -c "warning: round [0-9]*: the consensus distance grew" "$tmp/out") -eq 1 ]] ||
        fail "expected one warning"
    tail -1 "$tmp/m.jsonl" | grep -q '"event":"done"' || fail "the run did not finish"
    # A non-finite loss stops even under warn, with the algorithm's knob.
    timeout 120 "$hs" sim -n 4 --algo dpsgd --synthetic --subset 2000 --test-subset 200 --lr 100 \
        --rounds 200 --on-divergence warn --quiet --metrics "$tmp/nan.jsonl" >"$tmp/out" 2>&1
    rc=$?
    cat "$tmp/out"
    [[ $rc -eq 3 ]] || fail "non-finite loss: exit $rc, expected 3"
    grep -q "not finite\|loss is nan\|loss is inf\|loss is -nan" "$tmp/out" || fail "no reason"
    grep -q -- "--gamma-c" "$tmp/out" && fail "--gamma-c suggested for dpsgd"
    grep -q -- "--lr (now 100" "$tmp/out" || fail "the advice does not name --lr"
    tail -1 "$tmp/nan.jsonl" | grep -q '"event":"diverged"' || fail "no diverged record"
    ;;
launch-diverges)
    need_data
    "$hs" launch -n 4 --algo choco --compress topk:0.01 --gamma-c 0.4 --topology ring --insecure \
        --test-subset 1000 --eval-every 10 --no-plot --runs-dir "$tmp" --name div \
        >"$tmp/out" 2>&1 &
    lp=$!
    pids+=($lp)
    for _ in $(seq 3000); do
        kill -0 $lp 2>/dev/null || break
        sleep 0.1
    done
    kill -0 $lp 2>/dev/null && fail "launch still running after 300 s: $(tail -5 "$tmp/out")"
    wait $lp
    rc=$?
    cat "$tmp/out"
    [[ $rc -eq 3 ]] || fail "launch exited $rc, expected 3"
    [[ $(grep -c "stopped: its run diverged (exit status 3)" "$tmp/out") -eq 4 ]] ||
        fail "not every peer stopped with exit status 3"
    grep -q "^summary: 4 peers (0 failed, 4 diverged)" "$tmp/div/summary.txt" ||
        fail "summary.txt: $(cat "$tmp/div/summary.txt")"
    [[ $(grep -c "^diverged: peer [0-9]* at round [0-9]*: " "$tmp/div/summary.txt") -eq 4 ]] ||
        fail "summary.txt does not say why each peer stopped"
    grep -q "^to fix: lower --gamma-c" "$tmp/div/summary.txt" || fail "summary.txt has no advice"
    n=0
    for f in "$tmp"/div/peer-*.jsonl; do
        check_metrics "$f"
        n=$((n + 1))
    done
    [[ $n -eq 4 ]] || fail "$n metrics files, expected 4"
    ;;
run-neighbours-stop)
    # Three `hearsay run` peers, one with a learning rate that blows up: whoever sees it first
    # leaves with BYE and the reason, and the others stop on hearing it (or on seeing it
    # themselves): every peer ends with exit status 3 and a diverged record, and at least one
    # stopped because a neighbour told it. Synthetic data; the run would last 3000 rounds.
    ip="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$(($$ % 250 + 2))"
    common=(--algo dpsgd --synthetic --subset 3000 --test-subset 300 --rounds 3000 --world 3
            --wait-peers 3 --insecure --quiet)
    run=()
    "$hs" run --listen "$ip:7410" "${common[@]}" --lr 100 --metrics "$tmp/p0.jsonl" \
        >"$tmp/o0" 2>"$tmp/e0" &
    run+=($!)
    pids+=($!)
    for i in 1 2; do
        "$hs" run --listen "$ip:$((7410 + i))" --bootstrap "$ip:7410" "${common[@]}" \
            --metrics "$tmp/p$i.jsonl" >"$tmp/o$i" 2>"$tmp/e$i" &
        run+=($!)
        pids+=($!)
    done
    for p in "${run[@]}"; do
        timeout 120 tail --pid="$p" -f /dev/null || fail "a peer did not stop: $(tail -n 3 "$tmp"/e*)"
        wait "$p"
        rc=$?
        [[ $rc -eq 3 ]] || fail "a peer exited $rc, expected 3: $(tail -n 3 "$tmp"/e*)"
    done
    grep -h "diverged at round" "$tmp"/e0 "$tmp"/e1 "$tmp"/e2
    for i in 0 1 2; do
        tail -1 "$tmp/p$i.jsonl" | grep -q '"event":"diverged"' || fail "peer $i: no diverged record"
    done
    cat "$tmp"/p*.jsonl | grep '"event":"diverged"' | grep -q '"reason":"peer [0-9]* diverged: ' ||
        fail "no peer stopped on a neighbour's BYE"
    ;;
*)
    fail "unknown case $case"
    ;;
esac
echo ok
