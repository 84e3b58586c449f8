#!/usr/bin/env bash
# tools/plot draws every kind of run (issue 21 item 9): hearsay train, hearsay sim, one
# hearsay run, a hearsay launch directory and node-API metrics of several peers. Each gives
# the expected PNGs (a real PNG header, not a stub's size) and no gnuplot error.
# Usage: test_plot.sh HEARSAY AVG_PEER. Every command is bounded; processes killed by PID.
set -uo pipefail
hs=$1
peer=$2
plot=$HS_SOURCE_ROOT/tools/plot
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
command -v gnuplot >/dev/null || { echo "skip: gnuplot not installed (gnuplot-nox)"; exit 77; }
small=(--synthetic --subset 2000 --test-subset 200)

# plotted DIR WHAT PNG...: tools/plot DIR succeeds, silently for gnuplot, with each PNG.
plotted() {
    local d=$1 what=$2 p
    shift 2
    timeout 60 "$plot" "$d" >"$tmp/plot.out" 2>&1 || fail "$what: tools/plot failed: $(cat "$tmp/plot.out")"
    grep -Eq "line [0-9]+:|[Ee]rror" "$tmp/plot.out" && fail "$what: gnuplot complained: $(cat "$tmp/plot.out")"
    for p in "$@"; do
        f=$d/plots/$p
        [[ -f $f ]] || fail "$what: no $p: $(cat "$tmp/plot.out")"
        [[ $(stat -c %s "$f") -gt 10000 ]] || fail "$what: $p is $(stat -c %s "$f") bytes"
        [[ $(head -c 8 "$f" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || fail "$what: $p is not a PNG"
    done
    echo "ok: $what: $*"
}

mkdir -p "$tmp"/{train,sim,run,node}
timeout 120 "$hs" train "${small[@]}" --epochs 3 --quiet --metrics "$tmp/train/m.jsonl" >/dev/null 2>&1 ||
    fail "train failed"
plotted "$tmp/train" train accuracy.png loss.png
timeout 120 "$hs" sim -n 4 "${small[@]}" --rounds 40 --eval-every 5 --quiet \
    --metrics "$tmp/sim/m.jsonl" >/dev/null 2>&1 || fail "sim failed"
plotted "$tmp/sim" sim accuracy.png loss.png consensus.png
timeout 120 "$hs" run --insecure "${small[@]}" --rounds 30 --eval-every 5 --quiet \
    --listen 127.0.0.1:0 --metrics "$tmp/run/m.jsonl" >/dev/null 2>&1 || fail "run failed"
plotted "$tmp/run" "one run" accuracy.png loss.png
timeout 150 "$hs" launch -n 3 "${small[@]}" --rounds 30 --eval-every 5 --no-plot --runs-dir "$tmp" \
    --name launch >/dev/null 2>&1 || fail "launch failed"
plotted "$tmp/launch" launch accuracy.png loss.png consensus.png progress.png
ip="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$(($$ % 250 + 2))"
for r in 0 1 2; do
    timeout 120 "$peer" --dim 500 algo=dpsgd compress=none topology=ring world=3 rank=$r \
        rounds=30 insecure=1 listen=$ip:0 rendezvous="$tmp/rv" run-id="plot-$$" same-start=0 \
        metrics="$tmp/node/peer-{id}.jsonl" >"$tmp/node$r.log" 2>&1 &
    pids+=($!)
done
for i in 0 1 2; do wait "${pids[$i]}" || fail "node peer $i failed: $(tail -3 "$tmp/node$i.log")"; done
plotted "$tmp/node" "node API" loss.png consensus.png progress.png
