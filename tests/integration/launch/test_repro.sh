#!/usr/bin/env bash
# hearsay launch reproducible and named consistently (issue 21 item 5). Usage: test_repro.sh
# HEARSAY CASE. Every wait is bounded; every process started is killed by PID on exit.
#   repro  the same seeded synchronous launch twice (4 peers on a ring, so that places in the
#          topology matter): every peer's final parameters are the same bits; peer-N.log,
#          peer-N.jsonl and the saved model N are one process, peer N (id = launch index)
#   death  a peer killed mid-run: the live view counts it out at once, and the launcher's
#          message, the summary and the file names call it by the same number
set -uo pipefail
hs=$1
case=$2
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
cleanup_pid() {
    for c in $(pgrep -P "$1" 2>/dev/null); do kill -9 "$c" 2>/dev/null; done
}
small=(--synthetic --subset 3000 --test-subset 300 --batch 64 --seed 11 --no-plot)

case $case in
repro)
    for k in a b; do
        mkdir "$tmp/$k"
        timeout 150 "$hs" launch -n 4 "${small[@]}" --algo choco --topology ring --rounds 30 \
            --runs-dir "$tmp" --name "run-$k" --save "$tmp/$k/x{id}.bin" >"$tmp/$k.out" 2>&1 ||
            fail "launch $k: $(tail -5 "$tmp/$k.out")"
    done
    for i in 0 1 2 3; do
        cmp -s "$tmp/a/x$i.bin" "$tmp/b/x$i.bin" ||
            fail "peer $i: the two launches ended with different parameters"
        for k in a b; do
            d=$tmp/run-$k
            want="joined as peer $i "
            [[ $i == 0 ]] && want="info: wrote "
            grep -q "$want" "$d/peer-$i.log" || fail "$k: peer-$i.log is not peer $i: $(grep -m1 'joined as' "$d/peer-$i.log")"
            grep -q "shard $i of 4" "$d/peer-$i.log" || fail "$k: peer-$i.log is not rank $i"
            grep -q "\"peer\":$i[,}]" "$d/peer-$i.jsonl" || fail "$k: peer-$i.jsonl is not peer $i"
        done
    done
    echo "ok: two seeded launches, bit-identical final parameters; file names agree"
    ;;
death)
    "$hs" launch -n 4 "${small[@]}" --rounds 100000 --refresh 0.1 --runs-dir "$tmp" --name dies \
        >"$tmp/out" 2>&1 &
    lp=$!
    pids+=($lp)
    for _ in $(seq 600); do
        [[ $(grep -l "starting at round" "$tmp"/dies/peer-*.log 2>/dev/null | wc -l) -eq 4 ]] && break
        sleep 0.1
    done
    victim=$(pgrep -f -- "--rank 2 --rendezvous $tmp/dies/" | head -1)
    [[ -n $victim ]] || fail "cannot find the peer of rank 2"
    kill -9 "$victim"
    for _ in $(seq 600); do
        grep -q "peers running" "$tmp/out" && [[ $(grep "peers running" "$tmp/out" | tail -1) == *" 3/4 peers running"* ]] && break
        sleep 0.1
    done
    kill -INT $lp
    for _ in $(seq 600); do kill -0 $lp 2>/dev/null || break; sleep 0.1; done
    wait $lp
    cat "$tmp/out" | grep -v "peers running" | tail -5
    grep -q "3/4 peers running" "$tmp/out" || fail "the live view never counted the dead peer out: $(grep 'peers running' "$tmp/out" | tail -2)"
    grep -q "peer 2 (pid $victim) was killed by signal 9" "$tmp/out" || fail "not reported as peer 2"
    grep -q "^dead: peer 2 after round" "$tmp/out" || fail "the summary does not call it peer 2"
    grep -q "^dead: peer [013] " "$tmp/out" && fail "the summary lists another peer as dead"
    echo "ok: the dead peer is peer 2 everywhere, and the view counts it out"
    ;;
*)
    fail "unknown case $case"
    ;;
esac
