#!/usr/bin/env bash
# The models-of-any-size test (tests/integration/big/test_big.sh) at a size no CI machine runs:
# by default 1B float32 parameters (a 4 GB vector; issue 21 item 0): two peers join over TLS,
# 1 round of D-PSGD, stop with a checkpoint, resume for the job's 2 other rounds. Each phase's peak
# memory per peer, in vectors, and the run's wall time are in the test's lines. CHOCO is left
# out by default: its own state is 5 vectors (x, its xhat, the neighbour's replica, the
# running mix, a scratch difference), 20 GB a peer at 1B, two peers 40 GB.
#
#   tools/bench/big/run_1b.sh [BUILD_DIR]    env: BIG_DIM (1000000000), BIG_PHASES (dpsgd),
#                                            BIG_STOP (1), BIG_ROUNDS (3), BIG_NEED_GB (19),
#                                            BIG_LOCK (/work/wt/BIGRUN.lock)
#
# The machine is shared: the run announces itself with BIG_LOCK (others start nothing large
# while it is there; removed on any exit), starts only when `free -g` shows BIG_NEED_GB
# available, and kills its own peers (by PID) when the memory available falls under 1 GB,
# before the kernel's OOM killer would pick a process of someone else.
set -uo pipefail
build=${1:-build}
peer=$build/tests/integration/big/bigpeer
[[ -x $peer ]] || { echo "no $peer: build first (ninja -C $build)"; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
lock=${BIG_LOCK:-/work/wt/BIGRUN.lock}
need=${BIG_NEED_GB:-19}
export BIG_DIM=${BIG_DIM:-1000000000} BIG_PHASES=${BIG_PHASES:-dpsgd}
# A round of 1B takes minutes on 2 shared cores: 1 round, the stop, 2 more after the resume.
export BIG_STOP=${BIG_STOP:-1} BIG_ROUNDS=${BIG_ROUNDS:-3}
export BIG_DEADLINE_S=${BIG_DEADLINE_S:-3000} BIG_TIMEOUT_MS=${BIG_TIMEOUT_MS:-1200000}
export MALLOC_PERTURB_=0 HEARSAY_LOG=${HEARSAY_LOG:-info}
[[ -e $lock ]] && { echo "$lock exists: another large run is on ($(cat "$lock"))"; exit 2; }
avail=$(free -g | awk '/^Mem:/ { print $7 }')
[[ $avail -ge $need ]] || { echo "only $avail GB available, $need needed"; exit 2; }
echo "$$ $(date -u +%FT%TZ) $BIG_DIM parameters" >"$lock"
watch_pid=
trap 'rm -f "$lock"; [[ -n $watch_pid ]] && kill "$watch_pid" 2>/dev/null' EXIT
# The watchdog kills the peers (children of the test), never anything else.
main=$$
(
    while sleep 1; do
        kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
        if [[ $kb -lt 1048576 ]]; then
            echo "run_1b: only $((kb / 1024)) MiB available: killing this run's peers"
            kids=$(pgrep -P "$main" | tr '\n' ',')
            for p in $(pgrep -x bigpeer -P "${kids%,}" 2>/dev/null); do
                kill -9 "$p"
            done
        fi
    done
) &
watch_pid=$!
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); $(lscpu | sed -n 's/^Model name: *//p')"
t0=$(date +%s)
bash "$here/../../../tests/integration/big/test_big.sh" "$peer"
rc=$?
echo "rc $rc in $(($(date +%s) - t0)) s; load after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $rc
