#!/usr/bin/env bash
# hearsay launch reproducible and named consistently (issue 21 item 5). Usage: test_repro.sh
# HEARSAY CASE. Every wait is bounded; every process started is killed by PID on exit.
#   repro  the same seeded synchronous launch twice (4 peers on a ring, so that places in the
#          topology matter, and a random compressor, CHOCO with random-k): every peer's final
#          parameters are the same bits, and the simulator's; D-PSGD with QSGD on a schedule
#          of 3 matrices gives the simulator's bits too; peer-N.log, peer-N.jsonl and the
#          saved model N are one process, peer N (id = launch index)
#   death  a peer killed mid-run: the live view counts it out at once, and the launcher's
#          message, the summary and the file names call it by the same number
#   order  4 `hearsay run --rank R --rendezvous F` started at once, the highest rank first: each
#          joins as peer R (ids, hence places in the topology, follow --rank, not the race)
#   replay runs/NAME/config.json is the resolved configuration (one key per option, defaults
#          included, no raw flags) and `launch --config` of it gives the same final parameters
set -uo pipefail
hs=$1
case=$2
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
cleanup_pid() {
    for c in $(pgrep -P "$1" 2>/dev/null); do kill -9 "$c" 2>/dev/null; done
}
data=(--synthetic --subset 3000 --test-subset 300 --batch 64 --seed 11)
small=("${data[@]}" --no-plot)

case $case in
repro)
    # Random compressors draw by the round counted from the job's first, and a schedule's
    # matrices follow that count, which a networked job reaches after its joins (round 4, 8 or
    # 12 on loopback, as they fall) and the simulator starts at 0: the simulator's bits hold
    # both to that count even when the launches happen to start at the same round. The choco
    # default (sign:512) is deterministic; replay launches it twice.
    cat >"$tmp/sched.json" <<'EOF'
{"peers": 4, "schedule": [{"edges": [[0, 1], [2, 3]]}, {"edges": [[0, 2], [1, 3]]},
                          {"edges": [[0, 3], [1, 2]]}]}
EOF
    declare -A jobs=([a]="choco randk:0.1:unscaled ring" [b]="choco randk:0.1:unscaled ring"
                     [c]="dpsgd qsgd:16 $tmp/sched.json")
    for k in a b c; do
        mkdir "$tmp/$k" "$tmp/sim-$k"
        read -r algo comp topo <<<"${jobs[$k]}"
        job=(--algo "$algo" --compress "$comp" --topology "$topo" --rounds 30)
        timeout 150 "$hs" launch -n 4 "${small[@]}" "${job[@]}" --runs-dir "$tmp" \
            --name "run-$k" --save "$tmp/$k/x{id}.bin" >"$tmp/$k.out" 2>&1 ||
            fail "launch $k: $(tail -5 "$tmp/$k.out")"
        [[ $k == b ]] && continue
        timeout 100 "$hs" sim -n 4 "${data[@]}" "${job[@]}" --quiet --save-dir "$tmp/sim-$k" \
            >"$tmp/sim-$k.out" 2>&1 ||
            fail "sim $k: $(tail -5 "$tmp/sim-$k.out")"
    done
    grep -h "starting at round" "$tmp"/run-[abc]/peer-0.log
    for i in 0 1 2 3; do
        cmp -s "$tmp/a/x$i.bin" "$tmp/b/x$i.bin" ||
            fail "peer $i: the two launches ended with different parameters"
        for k in a c; do
            cmp -s "$tmp/$k/x$i.bin" "$tmp/sim-$k/peer-$i.bin" ||
                fail "peer $i: launch $k (${jobs[$k]}) ended elsewhere than the simulator"
        done
        for k in a b; do
            d=$tmp/run-$k
            want="joined as peer $i "
            [[ $i == 0 ]] && want="info: wrote "
            grep -q "$want" "$d/peer-$i.log" || fail "$k: peer-$i.log is not peer $i: $(grep -m1 'joined as' "$d/peer-$i.log")"
            grep -q "shard $i of 4" "$d/peer-$i.log" || fail "$k: peer-$i.log is not rank $i"
            grep -q "\"peer\":$i[,}]" "$d/peer-$i.jsonl" || fail "$k: peer-$i.jsonl is not peer $i"
        done
    done
    echo "ok: two seeded launches with random-k, bit-identical final parameters, the simulator's too (and QSGD on a schedule); file names agree"
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
order)
    ip="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$(($$ % 250 + 2))"
    for r in 3 2 1 0; do
        timeout 120 "$hs" run --insecure --synthetic --subset 2000 --test-subset 200 --rounds 5 \
            --world 4 --rank $r --rendezvous "$tmp/rv" --run-id "order-$$" --listen "$ip:0" \
            >"$tmp/o$r.out" 2>"$tmp/o$r.err" &
        pids+=($!)
    done
    for i in 0 1 2 3; do wait "${pids[$i]}" || fail "a peer failed: $(tail -3 "$tmp"/o*.err)"; done
    grep -q "info: wrote " "$tmp/o0.err" || fail "rank 0 did not start the job"
    for r in 1 2 3; do
        grep -q "joined as peer $r " "$tmp/o$r.err" ||
            fail "rank $r: $(grep -o 'joined as peer [0-9]*' "$tmp/o$r.err")"
    done
    echo "ok: ranks 0-3 started highest first are peers 0-3"
    ;;
replay)
    mkdir "$tmp/a" "$tmp/b"
    # A flag given twice (the last counts) and defaults left to the launcher.
    timeout 150 "$hs" launch -n 3 "${small[@]}" --rounds 20 --lr 0.3 --lr 0.1 --hidden 64,32 \
        --runs-dir "$tmp" --name first --save "$tmp/a/x{id}.bin" >"$tmp/a.out" 2>&1 ||
        fail "launch: $(tail -5 "$tmp/a.out")"
    c=$tmp/first/config.json
    /usr/bin/python3 - "$c" <<'PY' || fail "config.json is not the resolved configuration: $(cat "$c")"
import json, sys
c = json.load(open(sys.argv[1]))
assert "peer_args" not in c, "raw peer arguments"
for k, v in {"algo": "choco", "compress": "sign:512", "topology": "ring", "lr": 0.1,
             "hidden": "64,32", "batch": 64, "momentum": 0.9, "weight-decay": 0.0001,
             "lr-schedule": "cosine", "seed": "11", "peers": 3, "partition": "iid",
             "on-divergence": "stop", "optimizer": "sgd", "rounds": 20,
             "momentum-kind": "local"}.items():
    assert c.get(k) == v, (k, c.get(k), v)
assert isinstance(c.get("gamma-c"), float) and 0 < c["gamma-c"] <= 1, c.get("gamma-c")
assert "name" not in c
PY
    timeout 150 "$hs" launch --config "$c" --name second --save "$tmp/b/x{id}.bin" \
        >"$tmp/b.out" 2>&1 || fail "launch --config $c: $(tail -5 "$tmp/b.out")"
    for i in 0 1 2; do
        cmp -s "$tmp/a/x$i.bin" "$tmp/b/x$i.bin" || fail "peer $i: the replay ended elsewhere"
    done
    echo "ok: config.json is resolved, and launching it again gives the same parameters"
    ;;
*)
    fail "unknown case $case"
    ;;
esac
