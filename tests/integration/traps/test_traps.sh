#!/usr/bin/env bash
# Command-line traps a new user fell into, each checked with the real binary on loopback.
# Usage: test_traps.sh HEARSAY CASE
#   launch-secret  hearsay launch --secret-file F runs (its option keys collided with run's)
#   world-waits    --world 2 alone makes the first peer wait for the second before round 0
#   rounds-same    peers given different --rounds, or a joiner without the first's
#                  --wait-peers, all train the job's rounds and end at the same round
#   wait-signal    SIGINT / SIGTERM end --wait-peers at once: exit 130 / 143
#   unsharded      peers without --world are warned that each trains on the whole dataset
#   rank-range     --rank 5 --world 2 is refused (exit 2)
#   port-in-use    a --listen address in use: exit 2, the message names the address
#   launch-unique  two launches at once never share a run directory
#   rendezvous     under mpirun the rendezvous file is named by the job id, and a stale one
#                  (its address dead) does not fail the job
#   summary-dead   the launcher's summary averages the peers that finished; the dead are
#                  listed apart
# Every wait is bounded; everything started is killed by PID on exit.
set -uo pipefail
hs=$1
case=$2
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
cleanup_extra() {
    # Peers started by a launcher carry the run directory in their arguments.
    pkill -9 -f "$tmp/" 2>/dev/null
}
small=(--synthetic --subset 2000 --test-subset 200 --batch 32)
ip="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$(($$ % 250 + 2))"
# finish PID NAME: waits (bounded) for a process started here and returns its exit status.
finish() {
    timeout 120 tail --pid="$1" -f /dev/null || fail "$2 did not finish"
    wait "$1"
}
# span FILE: "FIRST..LAST" from a peer's final line.
span() { sed -n 's/.*rounds \([0-9]*\.\.[0-9]*\),.*/\1/p' "$1"; }

case $case in
launch-secret)
    head -c 32 /dev/urandom >"$tmp/run.key"
    chmod 600 "$tmp/run.key"
    timeout 120 "$hs" launch -n 2 --secret-file "$tmp/run.key" "${small[@]}" --rounds 10 \
        --runs-dir "$tmp" --name s --no-plot >"$tmp/out" 2>&1
    rc=$?
    [[ $rc -eq 0 ]] || fail "launch --secret-file exited $rc: $(tail -5 "$tmp/out")"
    grep -q -- "--secret-file $tmp/run.key" "$tmp"/s/peer-0.log "$tmp/s/config.json" 2>/dev/null ||
        grep -rq "run.key" "$tmp/s" || fail "the secret file was not passed to the peers"
    echo "ok: $(grep summary "$tmp/out")"
    ;;
world-waits)
    common=(--insecure "${small[@]}" --world 2 --rounds 30 --metrics "$tmp/m-{id}.jsonl")
    "$hs" run --listen "$ip:7500" "${common[@]}" >"$tmp/p0.out" 2>"$tmp/p0.err" &
    p0=$!
    pids+=($p0)
    wait_for 30 grep -q "waiting for 2 peers" "$tmp/p0.err" || fail "peer 0 does not wait: $(tail -3 "$tmp/p0.err")"
    # The decision to wait is logged before the first round: nothing may have been trained.
    ! grep -qs '"round"' "$tmp"/m-*.jsonl || fail "peer 0 trained before peer 1 came"
    "$hs" run --listen "$ip:7501" --bootstrap "$ip:7500" "${common[@]}" >"$tmp/p1.out" 2>"$tmp/p1.err" &
    p1=$!
    pids+=($p1)
    finish $p0 "peer 0" || fail "peer 0 failed: $(tail -3 "$tmp/p0.err")"
    finish $p1 "peer 1" || fail "peer 1 failed: $(tail -3 "$tmp/p1.err")"
    a=$(span "$tmp/p0.out")
    b=$(span "$tmp/p1.out")
    [[ -n $a && $a == "$b" ]] || fail "the peers ran different rounds: $a and $b"
    [[ $((${a#*..} - ${a%..*})) -eq 30 ]] || fail "rounds $a: not the 30 asked for"
    ! grep -q "has --world 1" "$tmp"/p*.err || fail "a sharded job was warned about sharding"
    echo "ok: both ran rounds $a"
    ;;
rounds-same)
    # The trap: the first peer waits (--wait-peers 2), the joiner does not and asks for fewer
    # rounds. Both must train the job's 30 rounds from the same first round.
    "$hs" run --listen "$ip:7510" --insecure "${small[@]}" --wait-peers 2 --rounds 30 \
        >"$tmp/p0.out" 2>"$tmp/p0.err" &
    p0=$!
    pids+=($p0)
    wait_for 30 grep -q "waiting for 2 peers" "$tmp/p0.err" || fail "peer 0 does not wait"
    "$hs" run --listen "$ip:7511" --bootstrap "$ip:7510" --insecure "${small[@]}" --rounds 20 \
        >"$tmp/p1.out" 2>"$tmp/p1.err" &
    p1=$!
    pids+=($p1)
    finish $p0 "peer 0" || fail "peer 0 failed: $(tail -3 "$tmp/p0.err")"
    finish $p1 "peer 1" || fail "peer 1 failed: $(tail -3 "$tmp/p1.err")"
    a=$(span "$tmp/p0.out")
    b=$(span "$tmp/p1.out")
    [[ -n $a && $a == "$b" ]] || fail "the peers ran different rounds: $a and $b"
    [[ $((${a#*..} - ${a%..*})) -eq 30 ]] || fail "rounds $a: not the job's 30"
    grep -q -- "--rounds 20: the job trains 30 rounds" "$tmp/p1.err" || fail "the joiner was not told its --rounds is not the job's"
    echo "ok: both ran rounds $a"
    ;;
wait-signal)
    for sig in INT TERM; do
        "$hs" run --listen "$ip:7520" --insecure "${small[@]}" --world 3 --rounds 30 \
            --save "$tmp/model.bin" >"$tmp/out" 2>"$tmp/err.$sig" &
        p=$!
        pids+=($p)
        wait_for 30 grep -q "waiting for 3 peers" "$tmp/err.$sig" || fail "the peer does not wait: $(tail -3 "$tmp/err.$sig")"
        kill -$sig $p
        timeout 20 tail --pid=$p -f /dev/null || fail "SIG$sig did not end the wait"
        wait $p
        rc=$?
        want=$([[ $sig == INT ]] && echo 130 || echo 143)
        [[ $rc -eq $want ]] || fail "SIG$sig while waiting: exit $rc, expected $want: $(tail -3 "$tmp/err.$sig")"
        grep -q "stopped by a signal" "$tmp/err.$sig" || fail "no reason given: $(tail -3 "$tmp/err.$sig")"
        [[ ! -e $tmp/model.bin ]] || fail "an untrained model was saved"
        echo "ok: SIG$sig: exit $rc: $(tail -1 "$tmp/err.$sig")"
    done
    ;;
unsharded)
    "$hs" run --listen "$ip:7530" --insecure "${small[@]}" --wait-peers 2 --rounds 20 \
        >"$tmp/p0.out" 2>"$tmp/p0.err" &
    p0=$!
    pids+=($p0)
    wait_for 30 grep -q "waiting for 2 peers" "$tmp/p0.err" || fail "peer 0 does not wait"
    "$hs" run --listen "$ip:7531" --bootstrap "$ip:7530" --insecure "${small[@]}" --rounds 20 \
        >"$tmp/p1.out" 2>"$tmp/p1.err" &
    p1=$!
    pids+=($p1)
    finish $p0 "peer 0" || fail "peer 0 failed: $(tail -3 "$tmp/p0.err")"
    finish $p1 "peer 1" || fail "peer 1 failed: $(tail -3 "$tmp/p1.err")"
    for i in 0 1; do
        [[ $(grep -c "has --world 1: it trains on the whole dataset" "$tmp/p$i.err") -eq 1 ]] ||
            fail "peer $i was not warned once: $(grep -c 'world 1' "$tmp/p$i.err") warnings"
    done
    echo "ok: $(grep -m1 'world 1' "$tmp/p1.err")"
    ;;
rank-range)
    timeout 30 "$hs" run --listen "$ip:7540" --insecure "${small[@]}" --rank 5 --world 2 \
        --rounds 5 >"$tmp/out" 2>&1
    rc=$?
    [[ $rc -eq 2 ]] || fail "--rank 5 --world 2: exit $rc, expected 2: $(tail -3 "$tmp/out")"
    grep -q -- "--rank 5 is outside 0..1" "$tmp/out" || fail "no reason: $(cat "$tmp/out")"
    timeout 30 "$hs" run --listen "$ip:7540" --insecure "${small[@]}" --rank 1 --rounds 5 >"$tmp/out" 2>&1
    rc=$?
    [[ $rc -eq 2 ]] || fail "--rank 1 without --world: exit $rc, expected 2"
    echo "ok: $(cat "$tmp/out")"
    ;;
port-in-use)
    "$hs" run --listen "$ip:7550" --insecure "${small[@]}" --world 2 --rounds 5 >"$tmp/p0.out" 2>"$tmp/p0.err" &
    p0=$!
    pids+=($p0)
    wait_for 30 grep -q "waiting for 2 peers" "$tmp/p0.err" || fail "the first peer did not start"
    timeout 30 "$hs" run --listen "$ip:7550" --insecure "${small[@]}" --rounds 5 >"$tmp/out" 2>&1
    rc=$?
    kill $p0
    [[ $rc -eq 2 ]] || fail "port in use: exit $rc, expected 2: $(tail -3 "$tmp/out")"
    grep -q "$ip:7550" "$tmp/out" || fail "the message does not name the address: $(cat "$tmp/out")"
    echo "ok: $(cat "$tmp/out")"
    ;;
launch-unique)
    # Generated names: started together, they fall in the same second (or not); each launch
    # gets its own directory either way.
    for i in 1 2; do
        timeout 120 "$hs" launch -n 2 --insecure "${small[@]}" --rounds 10 --runs-dir "$tmp/runs" \
            --no-plot >"$tmp/l$i.out" 2>&1 &
        lp[$i]=$!
        pids+=(${lp[$i]})
    done
    for i in 1 2; do
        finish ${lp[$i]} "launch $i" || fail "launch $i failed: $(tail -5 "$tmp/l$i.out")"
    done
    dirs=$(ls "$tmp/runs" | wc -l)
    [[ $dirs -eq 2 ]] || fail "$dirs run directories for 2 launches: $(ls "$tmp/runs")"
    for d in "$tmp"/runs/*; do
        n=$(grep -l '"event":"done"' "$d"/peer-*.jsonl 2>/dev/null | wc -l)
        [[ $n -eq 2 ]] || fail "$d: $n finished peers, expected 2: $(ls "$d")"
    done
    echo "ok: $(ls "$tmp/runs" | tr '\n' ' ')"
    # The same --name twice at once: exactly one runs, the other is refused.
    for i in 1 2; do
        timeout 120 "$hs" launch -n 2 --insecure "${small[@]}" --rounds 10 --runs-dir "$tmp/runs" \
            --name same --no-plot >"$tmp/s$i.out" 2>&1 &
        lp[$i]=$!
        pids+=(${lp[$i]})
    done
    finish ${lp[1]} "launch 1"
    r1=$?
    finish ${lp[2]} "launch 2"
    r2=$?
    [[ "$r1 $r2" == "0 2" || "$r1 $r2" == "2 0" ]] || fail "same --name: exit statuses $r1 and $r2, expected 0 and 2"
    grep -q "exists already" "$tmp"/s*.out || fail "the refusal does not say why"
    echo "ok: same --name: exit $r1 and $r2"
    ;;
rendezvous)
    # Two tasks as mpirun starts them, in a directory holding stale rendezvous files (the
    # default name of old, and this job's name with an address nobody listens on).
    mkdir "$tmp/wd"
    hs=$(realpath "$hs")
    echo "hearsay-job $ip:7569" >"$tmp/wd/hearsay-job.addr"
    echo "hearsay-4242 $ip:7569" >"$tmp/wd/hearsay-4242.addr"
    touch -d '-20 seconds' "$tmp"/wd/*.addr
    task() {
        (cd "$tmp/wd" && exec env OMPI_COMM_WORLD_RANK=$1 OMPI_COMM_WORLD_SIZE=2 \
            OMPI_MCA_ess_base_jobid=4242 HEARSAY_LISTEN="$ip:$((7560 + $1))" \
            "$hs" run --insecure "${small[@]}" --rounds 20 >"$tmp/t$1.out" 2>"$tmp/t$1.err")
    }
    task 1 &
    t1=$!
    pids+=($t1)
    # Rank 1 reads the stale address first and finds nobody there; then rank 0 starts.
    wait_for 30 grep -q "did not let this peer in" "$tmp/t1.err" || fail "rank 1 did not try the stale address: $(tail -3 "$tmp/t1.err")"
    task 0 &
    t0=$!
    pids+=($t0)
    finish $t0 "rank 0" || fail "rank 0 failed: $(tail -3 "$tmp/t0.err")"
    finish $t1 "rank 1" || fail "rank 1 failed: $(tail -3 "$tmp/t1.err")"
    grep -q "to hearsay-4242.addr" "$tmp/t0.err" || fail "rank 0 did not write hearsay-4242.addr: $(grep rendezvous "$tmp/t0.err")"
    grep -q "^hearsay-4242 $ip:7560" "$tmp/wd/hearsay-4242.addr" || fail "the file does not hold rank 0's address"
    grep -q "^hearsay-job $ip:7569" "$tmp/wd/hearsay-job.addr" || fail "the old default file was used"
    echo "ok: $(span "$tmp/t0.out") and $(span "$tmp/t1.out") through hearsay-4242.addr"
    ;;
summary-dead)
    "$hs" launch -n 3 --insecure "${small[@]}" --algo dpsgd --rounds 100000 --eval-every 1 --peer-timeout 1000 \
        --runs-dir "$tmp" --name d --no-plot >"$tmp/out" 2>&1 &
    lp=$!
    pids+=($lp)
    wait_for 60 bash -c "[[ \$(grep -l test_acc '$tmp'/d/peer-*.jsonl 2>/dev/null | wc -l) -eq 3 ]]" ||
        fail "the peers did not report accuracies: $(tail -5 "$tmp/out")"
    victim=$(pgrep -P $lp -f -- "--rank 2 " | head -1)
    [[ -n $victim ]] || fail "cannot find the peer of rank 2"
    kill -9 "$victim"
    # The survivors go on without it (2 members) before they are stopped.
    wait_for 60 bash -c "[[ \$(for f in '$tmp'/d/peer-*.jsonl; do tail -1 \$f; done | grep -c '\"members\":2') -eq 2 ]]" ||
        fail "the survivors did not go on without the dead peer: $(tail -5 "$tmp/out")"
    kill -INT $lp
    finish $lp "the launcher"
    cat "$tmp/out" | tail -4
    line=$(grep '^summary:' "$tmp/out")
    [[ $line == *"over the 2 that finished"* ]] || fail "the summary does not count only the finished peers: $line"
    grep -q "^dead: peer [0-9]* after round" "$tmp/out" || fail "the dead peer is not listed"
    # The mean is that of the survivors' final reports, to the printed precision.
    want=$(grep -h '"event"' "$tmp"/d/peer-*.jsonl | sed -n 's/.*"test_acc":\([0-9.e-]*\).*/\1/p' |
        awk '{ s += $1; n++ } END { if (n == 2) printf "%.2f", 100 * s / n }')
    got=$(sed -n 's/.*accuracy mean \([0-9.]*\)%.*/\1/p' <<<"$line")
    [[ -n $want && $got == "$want" ]] || fail "summary mean $got%, the finished peers' mean is $want%"
    echo "ok: $line"
    ;;
*)
    fail "unknown case $case"
    ;;
esac
