#!/usr/bin/env bash
# Time to join and time of a round for a large model against the link's rate: two peers of the
# node API (tests/integration/big/bigpeer) on loopback over TLS, D-PSGD without compression (one
# message of 4d bytes each way per round), every link emulated at each rate (--emulate
# rate=...). A fresh job's joiner keeps its own vector (its WELCOME carries the job's terms
# only), so the join is timed where the model travels: the job runs 2 rounds and stops with a
# checkpoint, rank 0 resumes from it and a new peer, rank 1 without a checkpoint, joins it and
# gets the job's model in its WELCOME (4d bytes). For each (d, rate): that joiner's
# hs_node_start (dial, TLS, HELLO, JOIN, the WELCOME's snapshot in PART frames, adopting it), the
# median round of both peers after it, next to the link's own time for 4d bytes (4d * 8 /
# rate), and each peer's peak resident memory in vectors of d floats.
#
#   tools/bench/big/join_round.sh [BUILD_DIR] [D...]    (default: build, 25000000 100000000)
#   env: RATES="100mbit 1gbit 10gbit 0" ROUNDS=3 (rounds after the join)
set -uo pipefail
build=${1:-build}
shift || true
dims=("$@")
[[ ${#dims[@]} -gt 0 ]] || dims=(25000000 100000000)
read -r -a rates <<<"${RATES:-100mbit 1gbit 10gbit 0}"
rounds=${ROUNDS:-3}
peer=$build/tests/integration/big/bigpeer
[[ -x $peer ]] || { echo "no $peer: build first (ninja -C $build)"; exit 2; }
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
head -c 48 /dev/urandom | base64 >"$tmp/secret"
chmod 600 "$tmp/secret"
ip=127.0.0.$((RANDOM % 200 + 20))
port=$((7900 + RANDOM % 50))

# run PREFIX ARGS...: ranks 0 and 1 (rank 1 once rank 0 waits for it), both waited for; rank 0
# with the checkpoint directory and the arguments in only0.
only0=()
run() {
    local pre=$1 p0
    shift
    "$peer" "$@" rank=0 listen="$ip:$port" checkpoint-dir="$tmp/ck0" "${only0[@]}" \
        >"$tmp/${pre}o0" 2>"$tmp/${pre}l0" &
    p0=$!
    pids+=("$p0")
    for _ in $(seq 1200); do
        grep -q "waiting for 2 peers" "$tmp/${pre}l0" && break
        kill -0 "$p0" 2>/dev/null || break
        sleep 0.1
    done
    "$peer" "$@" rank=1 listen="$ip:$((port + 1))" bootstrap="$ip:$port" \
        >"$tmp/${pre}o1" 2>"$tmp/${pre}l1"
    wait "$p0"
}

printf "%-11s %-7s %9s %9s %11s %9s %9s\n" params rate join_s round_s link_s_4d hwm0_vec hwm1_vec
for d in "${dims[@]}"; do
    for rate in "${rates[@]}"; do
        port=$((port + 2))
        emu=()
        [[ $rate != 0 ]] && emu=(emulate="rate=$rate")
        args=(--dim "$d" world=2 secret-file="$tmp/secret" run-id="bench-$d-$rate" algo=dpsgd
            compress=none rounds=$((rounds + 2)) on-divergence=warn recv-timeout=600000
            join-timeout=600000 peer-timeout=60000 checkpoint-every=1000 "${emu[@]}")
        rm -rf "$tmp/ck0"
        only0=()
        run a --stop-after 1 "${args[@]}"
        ls "$tmp"/ck0/*.hsck >/dev/null 2>&1 || { tail -3 "$tmp/al0"; exit 1; }
        only0=(resume=1)
        run b "${args[@]}"
        read -r _ _ _ _ _ _ _ _ _ h0 _ vec _ _ _ r0 _ <"$tmp/bo0" || { tail -3 "$tmp/bl0"; exit 1; }
        read -r _ _ _ _ _ _ _ _ _ h1 _ _ _ j1 _ r1 _ <"$tmp/bo1" || { tail -3 "$tmp/bl1"; exit 1; }
        snap=$(sed -n 's/.*joined as .*snapshot of \([0-9]*\) bytes.*/\1/p' "$tmp/bl1")
        [[ -n $snap && $snap -ge $((4 * d)) ]] ||
            { echo "the joiner got no model: $(grep joined "$tmp/bl1")"; exit 1; }
        awk -v d="$d" -v rate="$rate" -v j="$j1" -v r0="$r0" -v r1="$r1" -v h0="$h0" -v h1="$h1" \
            -v v="$vec" 'BEGIN {
                bps = rate + 0; u = rate; sub(/^[0-9.]+/, "", u)
                if (u == "kbit") bps *= 1e3; else if (u == "mbit") bps *= 1e6; else if (u == "gbit") bps *= 1e9
                link = bps > 0 ? sprintf("%.2f", 4 * d * 8 / bps) : "-"
                printf "%-11d %-7s %9.2f %9.2f %11s %9.2f %9.2f\n", d, rate == 0 ? "none" : rate, j,
                       (r0 + r1) / 2, link, h0 / v, h1 / v }'
    done
done
