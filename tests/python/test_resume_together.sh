#!/usr/bin/env bash
# Two node-API peers of one job, each with its own checkpoint directory, die (SIGKILL) and are
# resumed at the same moment with no rank given (a resumed peer keeps its checkpoint's shard)
# (issue 21): the one
# whose checkpoint is of shard 0 restarts the job and the other joins it, so they end as one
# job (their vectors close together), not as two jobs each alone on its own new timeline (each
# would end at its own rank, 0 and 1). Then the same with one checkpoint directory for both:
# which shard is whose is unknown without a rank, so both refuse, naming the remedy, instead of
# both resuming shard 0 and removing each other's files.
# Usage: test_resume_together.sh (env: HEARSAY_LIB, HS_SOURCE_ROOT)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
need_python numpy
opts=(algo=dpsgd world=2 rounds=60 insecure=1 listen="$ip:0" rendezvous="$tmp/rv"
    run-id="together-$$" checkpoint-every=5 on-divergence=warn)
# both LOG DIR KILL OUT [NAME=VALUE...]: the two peers at once (resume_peer.py KILL OUT),
# logs in LOG{R}.log, checkpoints in DIR ({R}: the rank), PIDs in bpid.
bpid=()
both() {
    local log=$1 dir=$2 kill=$3 out=$4 r
    shift 4
    for r in 0 1; do
        "$py" "$here/resume_peer.py" "$kill" "${out//\{R\}/$r}" "${opts[@]}" \
            checkpoint-dir="${dir//\{R\}/$r}" "${@//\{R\}/$r}" >"$log$r.log" 2>&1 &
        pids+=($!)
        bpid[$r]=$!
    done
}
# ended R: waits (bounded) for peer R of the last `both`; its exit status.
ended() {
    timeout 120 tail --pid="${bpid[$1]}" -f /dev/null || fail "peer $1 did not end"
    wait "${bpid[$1]}" 2>/dev/null
}
# Phase 1: ranks 0 and 1, each killed 20 rounds after its first.
both "$tmp/a" "$tmp/ck{R}" 20 /dev/null rank={R}
for r in 0 1; do
    ended $r
    [[ $? == 137 ]] || fail "phase 1: peer $r was not killed: $(tail -3 "$tmp/a$r.log")"
    grep -q "as peer $r rank $r" "$tmp/a$r.log" || fail "phase 1: $(cat "$tmp/a$r.log")"
    ls "$tmp/ck$r"/ckpt-$r-*.hsck >/dev/null || fail "no checkpoint of shard $r: $(ls "$tmp/ck$r")"
done
# Phase 2: both at once, resume=1.
both "$tmp/b" "$tmp/ck{R}" 0 "$tmp/x{R}" resume=1
for r in 0 1; do
    ended $r || fail "resumed peer $r: $(tail -5 "$tmp/b$r.log")"
done
n=$(cat "$tmp"/b*.log | grep -c "no member of the checkpoint.s job answers")
[[ $n == 1 ]] || fail "$n peers restarted the job: $(grep -h "answers\|joined as\|started at" "$tmp"/b*.log)"
"$py" - "$tmp" <<'PY' || fail "the resumed peers were not one job"
import sys, numpy as np
x0, x1 = (np.fromfile(f"{sys.argv[1]}/x{r}", np.float32) for r in (0, 1))
gap = float(np.abs(x0 - x1).max())
print(f"final vectors: {x0[0]:.5f} and {x1[0]:.5f}, gap {gap:.3g}")
# Two jobs each alone would end at their ranks, 0 and 1; one job keeps them within 0.15.
assert gap < 0.15, gap
PY
echo "ok: two peers resumed at once are one job"
# One directory for both shards and no rank: both refuse (exit non-zero), saying why.
mkdir -p "$tmp/shared"
cp "$tmp"/ck0/ckpt-*.hsck "$tmp"/ck1/ckpt-*.hsck "$tmp/shared/"
both "$tmp/c" "$tmp/shared" 0 "$tmp/y{R}" resume=1
for r in 0 1; do
    ended $r && fail "peer $r resumed from a directory of 2 shards without a rank: $(tail -5 "$tmp/c$r.log")"
    grep -q "checkpoints of shards .* give .*rank" "$tmp/c$r.log" || fail "no reason: $(tail -5 "$tmp/c$r.log")"
done
ls "$tmp"/shared/ckpt-0-*.hsck "$tmp"/shared/ckpt-1-*.hsck >/dev/null || fail "files were removed: $(ls "$tmp/shared")"
echo "ok: no rank and one directory of 2 shards: both refuse, nothing removed"
