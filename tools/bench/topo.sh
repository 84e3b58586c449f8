#!/usr/bin/env bash
# Benchmark of `hearsay topo check` on a random regular graph (default: 1024 peers, degree 8):
# generates the file once, then times the full check (spectral gap included) REPEAT times and
# prints one line for docs/RESULTS.md with the median, the minimum and the machine.
#   tools/bench/topo.sh [HEARSAY] [PEERS] [DEGREE] [REPEAT]      (or: ninja -C build bench-topo)
set -euo pipefail
hs=${1:-build/hearsay}
n=${2:-1024}
d=${3:-8}
reps=${4:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
f=$tmp/regular-$n-d$d.json

now() { date +%s%N; }
t0=$(now)
"$hs" topo gen regular -n "$n" --degree "$d" --seed 1 -o "$f"
gen_ms=$((($(now) - t0) / 1000000))

times=()
for ((k = 0; k < reps; k++)); do
    t0=$(now)
    "$hs" topo check "$f" >"$tmp/out"
    times+=($((($(now) - t0) / 1000000)))
done
grep -E '^(spectral gap|result)' "$tmp/out" | sed 's/^/# /'
sorted=($(printf '%s\n' "${times[@]}" | sort -n))
median=${sorted[$((reps / 2))]}
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
printf 'topo check regular-%d-d%d: %d.%03d s median of %d (min %d.%03d s; gen %d ms) | ' \
    "$n" "$d" $((median / 1000)) $((median % 1000)) "$reps" $((sorted[0] / 1000)) \
    $((sorted[0] % 1000)) "$gen_ms"
printf '%s, %s cores, OPENBLAS_NUM_THREADS=%s | %s topo check FILE\n' "$cpu" "$(nproc)" \
    "${OPENBLAS_NUM_THREADS:-unset}" "$hs"
