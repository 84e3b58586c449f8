#!/usr/bin/env bash
# A D-PSGD peer whose own link is slow and whose neighbour's is fast (net_big failed once so on a
# loaded machine, peer 1 peaking at 3.17 vectors of 100M): two peers of 25M parameters (100 MB
# messages), peer 1's outgoing frames paced at 1 Gbit/s (0.8 s a message), peer 0's not. Peer 1
# has its neighbour's message of a round long before its own is out. It built its next message
# at once, the last one still queued: two messages and x alive (3 vectors), and the new one
# refused by send() (the queue's limit), a round lost to peer 0, every other round. At the job's
# end the node copied x while the last message was still queued: 3 vectors again. Now a
# synchronous algorithm waits for the link to take the message before it builds the next one
# (hs_exchange_ops.wait_room), and for the last one before the job ends.
# Asserted: both peers run their rounds; peer 1 sends every round's message (no "not sent" in its
# log); its peak memory exceeds peer 0's, which holds the same vectors, by under half a vector
# (the difference was one vector, the extra message). --max-frame 8 MiB keeps the pieces of a
# message that wait to be mixed (a quarter of the queue's limit) small against the vector.
# With `stop`, peer 1 is asked to stop (as by SIGTERM) after 2 rounds: the stop lets its last
# message leave (a bounded wait) before the node copies x, so the same peak holds there.
# About 6 s, 0.5 GB of memory. Usage: test_slow_uplink.sh BIGPEER [stop]
set -uo pipefail
peer=$1
stop=()
[[ ${2:-} == stop ]] && stop=(--stop-after 2)
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
d=25000000 rounds=4
ip="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$(($$ % 250 + 2))"
port=$((7600 + RANDOM % 300))
head -c 48 /dev/urandom | base64 >"$tmp/secret"
chmod 600 "$tmp/secret"
common=(--dim "$d" world=2 secret-file="$tmp/secret" run-id="uplink-$$" seed=3
    on-divergence=warn recv-timeout=60000 join-timeout=60000 peer-timeout=15000
    max-frame=8388608 algo=dpsgd compress=none rounds="$rounds")
HEARSAY_LOG=debug "$peer" "${common[@]}" rank=0 listen="$ip:$port" >"$tmp/o0" 2>"$tmp/l0" &
p0=$!
pids+=("$p0")
wait_for 60 grep -q "waiting for 2 peers" "$tmp/l0" || fail "peer 0 did not start: $(tail -3 "$tmp/l0")"
HEARSAY_LOG=debug "$peer" "${common[@]}" rank=1 listen="$ip:$((port + 1))" bootstrap="$ip:$port" \
    emulate=rate=1gbit "${stop[@]}" >"$tmp/o1" 2>"$tmp/l1" &
p1=$!
pids+=("$p1")
for r in 0 1; do
    p=p$r
    timeout 90 tail --pid="${!p}" -f /dev/null || fail "peer $r did not finish in 90 s"
    wait "${!p}" || fail "peer $r failed: $(tail -5 "$tmp/l$r")"
done
hwm=()
for r in 0 1; do
    read -r _ steps _ _ _ _ _ _ _ h _ vec _ <"$tmp/o$r" || fail "peer $r printed no report"
    want=$rounds
    [[ $r == 1 && ${#stop[@]} -gt 0 ]] && want=2
    [[ $steps == "$want" ]] || fail "peer $r ran $steps rounds, not $want"
    hwm+=("$h")
    echo "peer $r: peak $((h / 1024)) MiB = $(awk -v h="$h" -v v="$vec" 'BEGIN { printf "%.2f", h / v }') vectors"
done
if grep -q "not sent" "$tmp/l1"; then
    grep "not sent" "$tmp/l1"
    fail "peer 1 did not send $(grep -c "not sent" "$tmp/l1") of its messages (its link's queue was full)"
fi
awk -v a="${hwm[0]}" -v b="${hwm[1]}" -v v="$vec" 'BEGIN { exit !(b - a < 0.5 * v) }' ||
    fail "peer 1 peaked $(awk -v a="${hwm[0]}" -v b="${hwm[1]}" -v v="$vec" 'BEGIN { printf "%.2f", (b - a) / v }')" \
        "vectors above peer 0: a second message of its own was alive"
echo "ok: over a slow uplink every round's message was sent, one at a time"
