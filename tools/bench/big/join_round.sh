#!/usr/bin/env bash
# Time to join and time of a round for a large model against the link's rate: two peers of the
# node API (tests/integration/big/bigpeer) on loopback over TLS, D-PSGD without compression (one
# message of 4d bytes each way per round), the joiner's WELCOME carrying a snapshot of 4d bytes;
# every link emulated at each rate (--emulate rate=...). For each (d, rate): the joiner's
# hs_node_start (dial, TLS, HELLO, JOIN, WELCOME with the snapshot in PART frames, adopting
# it) and the median round of both peers, next to the link's own time for 4d bytes (4d * 8 /
# rate), and each peer's peak resident memory in vectors of d floats.
#
#   tools/bench/big/join_round.sh [BUILD_DIR] [D...]    (default: build, 25000000 100000000)
#   env: RATES="1gbit 10gbit" ROUNDS=5
set -uo pipefail
build=${1:-build}
shift || true
dims=("$@")
[[ ${#dims[@]} -gt 0 ]] || dims=(25000000 100000000)
rates=(${RATES:-1gbit 10gbit 0})
rounds=${ROUNDS:-5}
peer=$build/tests/integration/big/bigpeer
[[ -x $peer ]] || { echo "no $peer: build first (ninja -C $build)"; exit 2; }
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
head -c 48 /dev/urandom | base64 >"$tmp/secret"
chmod 600 "$tmp/secret"
ip=127.0.0.$((RANDOM % 200 + 20))
port=$((7900 + RANDOM % 50))
printf "%-11s %-7s %9s %9s %11s %9s %9s\n" params rate join_s round_s link_s_4d hwm0_vec hwm1_vec
for d in "${dims[@]}"; do
    for rate in "${rates[@]}"; do
        port=$((port + 2))
        emu=()
        [[ $rate != 0 ]] && emu=(emulate="rate=$rate")
        args=(--dim "$d" world=2 secret-file="$tmp/secret" run-id="bench-$d-$rate" algo=dpsgd
            compress=none rounds="$rounds" on-divergence=warn recv-timeout=600000
            join-timeout=600000 peer-timeout=60000 "${emu[@]}")
        "$peer" "${args[@]}" rank=0 listen="$ip:$port" >"$tmp/o0" 2>"$tmp/l0" &
        pids+=($!)
        p0=$!
        for _ in $(seq 1200); do grep -q "waiting for 2 peers" "$tmp/l0" && break; sleep 0.1; done
        "$peer" "${args[@]}" rank=1 listen="$ip:$((port + 1))" bootstrap="$ip:$port" \
            >"$tmp/o1" 2>"$tmp/l1"
        wait "$p0"
        read -r _ _ _ _ _ _ _ _ _ h0 _ vec _ _ _ r0 _ <"$tmp/o0" || { tail -3 "$tmp/l0"; exit 1; }
        read -r _ _ _ _ _ _ _ _ _ h1 _ _ _ j1 _ r1 _ <"$tmp/o1" || { tail -3 "$tmp/l1"; exit 1; }
        awk -v d="$d" -v rate="$rate" -v j="$j1" -v r0="$r0" -v r1="$r1" -v h0="$h0" -v h1="$h1" \
            -v v="$vec" 'BEGIN {
                bps = rate + 0; u = rate; sub(/^[0-9.]+/, "", u)
                if (u == "kbit") bps *= 1e3; else if (u == "mbit") bps *= 1e6; else if (u == "gbit") bps *= 1e9
                link = bps > 0 ? sprintf("%.2f", 4 * d * 8 / bps) : "-"
                printf "%-11d %-7s %9.2f %9.2f %11s %9.2f %9.2f\n", d, rate == 0 ? "none" : rate, j,
                       (r0 + r1) / 2, link, h0 / v, h1 / v }'
    done
done
