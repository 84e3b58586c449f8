#!/usr/bin/env bash
# The models-of-any-size test (tests/integration/big/test_big.sh) at a size no CI machine runs:
# by default 1B float32 parameters (a 4 GB vector; issue 21 item 0).
#   ALGO=dpsgd (default): two peers join over TLS, 1 round of D-PSGD, stop with a checkpoint,
#     resume for the job's 2 other rounds (about 15.4 GB for the two peers at 1B).
#   ALGO=choco: two peers run BIG_CHOCO_ROUNDS (10) rounds of CHOCO with its default compressor,
#     sign:512 (BIG_CHOCO_COMPRESS to name another). CHOCO's own state is 5 vectors (x, its
#     xhat, the neighbour's replica, the running mix, a scratch difference): 20 GB a peer at 1B,
#     about 45 GB for the two, so a 1B run needs a larger machine than this one (BIG_DIM smaller
#     here: 300000000 took about 12 GB).
#   ALGO=dcd|sgp|beer: two peers run BIG_GOSSIP_ROUNDS (5) rounds of that algorithm with its
#     default compressor (qsgd:16, none, topk:0.01); each holds about 4.4, 3.2 and 12.4 vectors
#     (test_big.sh counts them): past 2^28 values (BIG_DIM 270000000) DCD needs 10 GB for the
#     two, SGP 7 GB and BEER 27 GB (it ran on 23 GB with a swap file: docs/RESULTS.md; BIG_NEED_GB
#     and the watchdog below count memory without swap, so run test_big.sh directly for that).
# Each phase's peak memory per peer, in vectors, the peers' x[0] (they must stay within 0.3),
# and the run's wall time are in the test's lines.
#
#   tools/bench/big/run_1b.sh [BUILD_DIR]    env: ALGO (dpsgd), BIG_DIM (1000000000),
#         BIG_PHASES (from ALGO), BIG_STOP (1), BIG_ROUNDS (3), BIG_CHOCO_ROUNDS (10),
#         BIG_GOSSIP_ROUNDS (5: DCD's, SGP's, BEER's),
#         BIG_NEED_GB (from ALGO and BIG_DIM), BIG_LOCK (/work/wt/BIGRUN.lock where /work/wt
#         is; empty: none), BIG_OUT (a directory for the log and the peers' logs and reports;
#         default: none, the test's scratch is removed), BIGPEER (the peer program: default
#         BUILD_DIR/tests/integration/big/bigpeer, else `bigpeer` on PATH)
#
# From a packed build (/work/shared/tools/gpu-pack: copy bigpeer into the pack's bin/ too), on
# a machine without this tree's build: `. .gpu/env.sh; ALGO=choco BIG_OUT=$OUT
# tools/bench/big/run_1b.sh` finds bigpeer on PATH and libhearsay beside `hearsay`.
#
# The machine may be shared: the run announces itself with BIG_LOCK (others start nothing large
# while it is there; removed on any exit), starts only when `free -g` shows BIG_NEED_GB
# available, and kills its own peers (by PID) when the memory available falls under 1 GB,
# before the kernel's OOM killer would pick a process of someone else.
set -uo pipefail
build=${1:-build}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
peer=${BIGPEER:-$build/tests/integration/big/bigpeer}
[[ -x $peer ]] || peer=$(command -v bigpeer) ||
    { echo "no $build/tests/integration/big/bigpeer and no bigpeer on PATH: build first (ninja -C $build)"; exit 2; }
# A packed build: libhearsay.so lies beside hearsay, not where bigpeer's build-tree RUNPATH says.
if hs=$(command -v hearsay); then
    export LD_LIBRARY_PATH=$(dirname "$(realpath "$hs")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
algo=${ALGO:-dpsgd}
case $algo in
dpsgd) vectors=2.4 ;;  # per peer at its peak: docs/RESULTS.md, 2.02 at 1B
choco) vectors=5.9 ;;  # its 5 vectors of state, the messages and the constant: 5.2-5.7
dcd) vectors=4.6 ;;    # 4 vectors (x, x_r, the replica, z) and 2 qsgd:16 messages: 4.39
sgp) vectors=3.5 ;;    # 2 vectors (x, the caller's z), the share sent, received pieces: 3.21
beer) vectors=12.75 ;; # 12 (x, V, s, X^r, 2 differences; H, G, mixes, replicas x 2): 12.43
*) echo "ALGO=$algo: dpsgd, choco, dcd, sgp or beer"; exit 2 ;;
esac
lock=${BIG_LOCK-/work/wt/BIGRUN.lock}
[[ -n $lock && ! -d $(dirname "$lock") ]] && lock=
export BIG_DIM=${BIG_DIM:-1000000000} BIG_PHASES=${BIG_PHASES:-$algo}
# Two peers' peaks and 2 GB to spare, in GB.
need=${BIG_NEED_GB:-$(awk -v d="$BIG_DIM" -v v="$vectors" 'BEGIN { printf "%d", 2 * v * 4 * d / 2^30 + 2.999 }')}
# A round of 1B takes minutes on 2 shared cores: 1 round, the stop, 2 more after the resume.
export BIG_STOP=${BIG_STOP:-1} BIG_ROUNDS=${BIG_ROUNDS:-3} BIG_CHOCO_ROUNDS=${BIG_CHOCO_ROUNDS:-10}
export BIG_GOSSIP_ROUNDS=${BIG_GOSSIP_ROUNDS:-5}
# CHOCO's default compressor (sign:512) unless one is named; the test's own default is fp16.
export BIG_CHOCO_COMPRESS=${BIG_CHOCO_COMPRESS-}
export BIG_DEADLINE_S=${BIG_DEADLINE_S:-3000} BIG_TIMEOUT_MS=${BIG_TIMEOUT_MS:-1200000}
export MALLOC_PERTURB_=0 HEARSAY_LOG=${HEARSAY_LOG:-info}
out=${BIG_OUT:-}
if [[ -n $out ]]; then
    mkdir -p "$out/scratch" || exit 2
    # The test's scratch (peers' logs and reports) goes there and is kept.
    export TMPDIR=$out/scratch KEEP_TMP=1
    exec > >(tee "$out/run_1b.log") 2>&1
fi
if [[ -n $lock ]]; then
    [[ -e $lock ]] && { echo "$lock exists: another large run is on ($(cat "$lock"))"; exit 2; }
fi
avail=$(free -g | awk '/^Mem:/ { print $7 }')
[[ $avail -ge $need ]] || { echo "only $avail GB available, $need needed"; exit 2; }
[[ -n $lock ]] && echo "$$ $(date -u +%FT%TZ) $BIG_DIM parameters, $algo" >"$lock"
watch_pid=
trap '[[ -n $lock ]] && rm -f "$lock"; [[ -n $watch_pid ]] && kill "$watch_pid" 2>/dev/null' EXIT
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
echo "$algo, $BIG_DIM parameters, $(nproc) CPUs, $avail GB available ($need needed); peer $peer"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); $(lscpu | sed -n 's/^Model name: *//p')"
t0=$(date +%s)
bash "$here/../../../tests/integration/big/test_big.sh" "$peer"
rc=$?
echo "rc $rc in $(($(date +%s) - t0)) s; load after: $(cut -d' ' -f1-3 /proc/loadavg)"
# Keep the logs and reports, not the checkpoints (4 GB each at 1B) nor the job's secret.
[[ -n $out ]] && find "$out/scratch" -mindepth 2 -maxdepth 2 \( -type d -name 'ck*' -o -name secret \) \
    -exec rm -rf {} +
exit $rc
