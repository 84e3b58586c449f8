#!/usr/bin/env bash
# Per-round overhead of the Python path against the C path: the same job (a ring of P peers on
# loopback, d floats: the example CNN's 206922 by default, the same local update) driven by
# tests/python/node_peer (C, hearsay/node.h) and by tests/python/node_peer.py (hearsay.Node),
# REPS times each, alternating, for P = 1 (no network: the step call's cost is the library's
# work plus, for Python, the binding's) and P = 4. Prints, per algorithm, size and driver, the
# median over runs of the peers' mean round time and of the time inside the step call
# (hs_node_step / Node.step), and the Python path's overhead in percent of the C round time.
#   tools/bench/python/overhead.sh [BUILD_DIR]
#   (env: ROUNDS=300 D=206922 REPS=3 PEERS="1 4" ALGOS="choco:topk:0.01 dpsgd:none"; D=1 PEERS=1
#   leaves the binding's own cost per call: the step call's difference)
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
build=$(realpath "${1:-$root/build}")
rounds=${ROUNDS:-300}
d=${D:-206922}
reps=${REPS:-3}
algos=${ALGOS:-"choco:topk:0.01 dpsgd:none"}
cpeer=$build/tests/python/node_peer
[[ -x $cpeer ]] || { echo "no $cpeer (meson setup -Dtests=true, ninja)" >&2; exit 2; }
export HEARSAY_LIB=$build/libhearsay.so.0 PYTHONPATH=$root/python
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
ip="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$(($$ % 250 + 2))"
job() { # job DRIVER ALGO COMPRESS TAG P: runs P peers, prints "round_ms step_ms" (peer means)
    local drv=$1 a=$2 c=$3 tag=$4 np=$5 r cmd=("$cpeer")
    [[ $drv == python ]] && cmd=(/usr/bin/python3 "$root/tests/python/node_peer.py")
    pids=()
    for ((r = 0; r < np; r++)); do
        "${cmd[@]}" --dim "$d" --out "$tmp/x" algo="$a" compress="$c" topology=ring world=$np \
            rank=$r rounds="$rounds" insecure=1 listen="$ip:0" rendezvous="$tmp/$tag.rv" \
            run-id="$tag" on-divergence=warn quiet=1 >"$tmp/$tag.$r" 2>&1 &
        pids+=($!)
    done
    for ((r = 0; r < np; r++)); do wait "${pids[$r]}" || { cat "$tmp/$tag.$r" >&2; exit 1; }; done
    cat "$tmp/$tag".* | awk '/^rounds/ { t += $4 / $2; s += $6 / $2; n++ }
        END { printf "%.4f %.4f\n", 1e3 * t / n, 1e3 * s / n }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "d=$d rounds=$rounds reps=$reps ring, $(lscpu | sed -n 's/^Model name: *//p'), load $(cut -d' ' -f1-3 /proc/loadavg)"
for np in ${PEERS:-1 4}; do
    for spec in $algos; do
        a=${spec%%:*}
        c=${spec#*:}
        t=$a-$np
        for ((i = 0; i < reps; i++)); do
            for drv in c python; do job $drv "$a" "$c" "$t-$drv-$i" $np >>"$tmp/$t-$drv"; done
        done
        cr=$(cut -d' ' -f1 "$tmp/$t-c" | median)
        cs=$(cut -d' ' -f2 "$tmp/$t-c" | median)
        pr=$(cut -d' ' -f1 "$tmp/$t-python" | median)
        ps=$(cut -d' ' -f2 "$tmp/$t-python" | median)
        awk -v a="$a" -v c="$c" -v np="$np" -v cr="$cr" -v cs="$cs" -v pr="$pr" -v ps="$ps" 'BEGIN {
            printf "%s %s, %d peers: C round %.3f ms (step %.3f ms), Python round %.3f ms " \
                   "(step %.3f ms): overhead %+.1f%% of the round, step call %+.3f ms\n",
                   a, c, np, cr, cs, pr, ps, 100 * (pr - cr) / cr, ps - cs }'
    done
done
