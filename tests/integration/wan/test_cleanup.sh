#!/usr/bin/env bash
# tools/wan removes every namespace, interface and process it made: after a clean run, after a
# peer fails, after a bad profile, and when it is killed with SIGTERM in the middle of a run;
# --tcp-cc sets the congestion control inside every namespace it made, and refuses a name the
# host does not allow namespaces.
#   test_cleanup.sh TOOLS_WAN   (environment: HEARSAY_WANEMU)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
wan=$1
[[ $(id -u) -eq 0 ]] || { echo "SKIP: needs root (network namespaces)"; exit 77; }
[[ -c /dev/net/tun ]] || { echo "SKIP: no /dev/net/tun"; exit 77; }
# Unique per run, so tests running side by side never see each other's namespaces.
prefix=hswc$$
cleanup_extra() { # in case the driver itself failed to: remove what carries our prefix
    local ns
    for ns in $(ip netns list | awk '{print $1}' | grep "^$prefix"); do ip netns del "$ns"; done
}
ours() { ip netns list | awk '{print $1}' | grep "^$prefix"; }
# Interfaces in this (the root) namespace of the kinds the driver or the emulator could leave
# behind by mistake (it makes none here); other tests' interfaces do not disturb the check.
links() { ip -o link show | awk -F': ' '{print $2}' | grep -E '^(wan|tun|hsw|veth)' | sort; }
links_before=$(links)
printf '{"peers": 3, "delay_ms": 2, "rate_mbit": 50}\n' >"$tmp/p.json"

check_clean() { # WHEN
    [[ -z $(ours) ]] || fail "$1: namespaces left: $(ours | tr '\n' ' ')"
    [[ $(links) == "$links_before" ]] || fail "$1: interfaces changed: $(diff <(echo "$links_before") <(links) | tr '\n' ' ')"
}

"$wan" --profile "$tmp/p.json" --name "$prefix-a" --timeout 20 -- \
    bash -c 'ping -c 1 -W 2 10.77.0.$(( (HEARSAY_WAN_INDEX + 1) % 3 + 1 )) >/dev/null' ||
    fail "a clean run (each peer pings the next) exited $?"
check_clean "after a clean run"

"$wan" --profile "$tmp/p.json" --name "$prefix-b" --timeout 20 -- \
    bash -c '[[ $HEARSAY_WAN_INDEX -ne 1 ]] || exit 3'
rc=$?
[[ $rc -eq 3 ]] || fail "peer 1 exited 3 but the driver exited $rc"
check_clean "after a failed peer"

# An allowed congestion control other than the default, when the host allows one.
cc=$(sysctl -n net.ipv4.tcp_allowed_congestion_control | tr ' ' '\n' |
    grep -vx "$(sysctl -n net.ipv4.tcp_congestion_control)" | head -1)
if [[ -n $cc ]]; then
    "$wan" --profile "$tmp/p.json" --name "$prefix-t" --tcp-cc "$cc" --timeout 20 -- \
        bash -c '[[ $(sysctl -n net.ipv4.tcp_congestion_control) == "$0" ]] || exit 4' "$cc"
    rc=$?
    [[ $rc -eq 0 ]] || fail "--tcp-cc $cc: a peer saw another congestion control (exit $rc)"
    check_clean "after --tcp-cc $cc"
else
    echo "note: the host allows namespaces no other congestion control: --tcp-cc not checked"
fi
"$wan" --profile "$tmp/p.json" --name "$prefix-u" --tcp-cc no-such-cc -- true 2>"$tmp/err" &&
    fail "--tcp-cc no-such-cc ran"
grep -q -- '--tcp-cc no-such-cc: not one the host allows' "$tmp/err" || fail "--tcp-cc: $(cat "$tmp/err")"
check_clean "after a refused --tcp-cc"

printf '{"peers": 3, "delay": 2}\n' >"$tmp/bad.json"
"$wan" --profile "$tmp/bad.json" --name "$prefix-x" -- true 2>"$tmp/err" && fail "a bad profile ran"
grep -q '"delay": unknown field' "$tmp/err" || fail "bad profile: $(cat "$tmp/err")"
check_clean "after a bad profile"

# SIGTERM while every peer sleeps: wait until all three are running, note their PIDs and the
# emulator's, then TERM the driver.
"$wan" --profile "$tmp/p.json" --name "$prefix-c" --timeout 50 -- \
    bash -c 'echo $$ >"$0/peer$HEARSAY_WAN_INDEX.pid"; echo $HEARSAY_WAN_EMU_PID >"$0/emu.pid"; exec sleep 40' "$tmp" &
drv=$!
pids+=("$drv")
for ((k = 0; k < 200; k++)); do
    [[ -s $tmp/peer0.pid && -s $tmp/peer1.pid && -s $tmp/peer2.pid ]] && break
    sleep 0.05
done
[[ $k -lt 200 ]] || fail "the peers did not start within 10 s"
[[ $(ours | wc -l) -eq 3 ]] || fail "expected 3 namespaces during the run, saw: $(ours | tr '\n' ' ')"
mapfile -t started < <(cat "$tmp/emu.pid" "$tmp"/peer{0,1,2}.pid)
[[ ${#started[@]} -eq 4 ]] || fail "expected 4 PIDs (emulator, 3 peers), got ${started[*]}"
for p in "${started[@]}"; do kill -0 "$p" 2>/dev/null || fail "process $p is not running"; done
kill -TERM "$drv"
for ((k = 0; k < 200; k++)); do kill -0 "$drv" 2>/dev/null || break; sleep 0.05; done
kill -0 "$drv" 2>/dev/null && fail "the driver was still running 10 s after SIGTERM"
wait "$drv"
rc=$?
[[ $rc -eq 143 ]] || fail "after SIGTERM the driver exited $rc, expected 143"
for p in "${started[@]}"; do kill -0 "$p" 2>/dev/null && fail "process $p outlived the driver"; done
check_clean "after SIGTERM"
echo "ok: nothing left after a clean run, a failed peer, a bad profile and SIGTERM"
