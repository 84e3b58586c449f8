#!/usr/bin/env bash
# Launchers' conventions: 2 processes that get only torchrun's variables (RANK, WORLD_SIZE,
# MASTER_ADDR, MASTER_PORT, LOCAL_RANK, TORCHELASTIC_RUN_ID), and then 2 with only SLURM's
# (SLURM_PROCID, SLURM_NTASKS, SLURM_JOB_ID, SLURM_STEP_ID), gossip to the average through
# hearsay.Node with no rank, world, rendezvous or bootstrap option. Each peer must take the
# rank it was given. Under SLURM the peers meet through hearsay-JOB.addr in the working
# directory; HEARSAY_LISTEN keeps them on this test's loopback address.
# Usage: test_env.sh (env: HEARSAY_LIB, HS_SOURCE_ROOT)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
need_python numpy
peer=("$py" "$here/avg_peer.py" --value {R} --expect 0.5 algo=dpsgd rounds=20 insecure=1)
port=$((20000 + RANDOM % 30000))
for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=$ip MASTER_PORT=$port \
        TORCHELASTIC_RUN_ID="env-$$" "${peer[@]//\{R\}/$r}" >"$tmp/t$r.log" 2>&1 &
    pids+=($!)
done
for r in 0 1; do
    timeout 120 tail --pid="${pids[$r]}" -f /dev/null || fail "torchrun peer $r did not finish"
    wait "${pids[$r]}" || fail "torchrun peer $r: $(tail -5 "$tmp/t$r.log")"
    grep -q " rank $r rounds " "$tmp/t$r.log" || fail "torchrun peer $r: $(cat "$tmp/t$r.log")"
done
echo "ok: torchrun's variables: 2 peers at the average"
mkdir -p "$tmp/slurm" && cd "$tmp/slurm"
for r in 0 1; do
    SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_JOB_ID=$$ SLURM_STEP_ID=0 HEARSAY_LISTEN=$ip:0 \
        "${peer[@]//\{R\}/$r}" >"$tmp/s$r.log" 2>&1 &
    pids+=($!)
done
for r in 0 1; do
    i=$((r + 2))
    timeout 120 tail --pid="${pids[$i]}" -f /dev/null || fail "SLURM peer $r did not finish"
    wait "${pids[$i]}" || fail "SLURM peer $r: $(tail -5 "$tmp/s$r.log")"
    grep -q " rank $r rounds " "$tmp/s$r.log" || fail "SLURM peer $r: $(cat "$tmp/s$r.log")"
done
[[ -f "hearsay-$$.0.addr" ]] || fail "no rendezvous file hearsay-$$.0.addr: $(ls)"
echo "ok: SLURM's variables: 2 peers at the average"
