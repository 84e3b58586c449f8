#!/usr/bin/env bash
# Node.state_dict round trip: 2 peers (D-PSGD, each pulled towards its own rank between the
# gossip steps, 40 rounds from the job's first round F) save their state after round F+6, run
# on and are killed (SIGKILL) at round F+10; 2 new processes load those states and start: each
# gets its saved vector back bit for bit, resumes at the saved round itself (the restarted
# peers wait for each other, so the member list that admits them takes effect at once:
# hs_net_config.hold_members) and runs to the saved job's end F+40, where the two vectors agree
# (the gossip went on between them).
# Usage: test_state.sh (env: HEARSAY_LIB, HS_SOURCE_ROOT)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
need_python numpy
opts=(algo=dpsgd world=2 rank={R} rounds=40 insecure=1 listen="$ip:0" rendezvous="$tmp/rv"
    run-id="state-$$" on-divergence=warn quiet=1)
for r in 0 1; do
    "$py" "$here/state_peer.py" save "$tmp/s$r" 6 10 "${opts[@]//\{R\}/$r}" >"$tmp/a$r.log" 2>&1 &
    pids+=($!)
done
for r in 0 1; do
    timeout 120 tail --pid="${pids[$r]}" -f /dev/null || fail "peer $r did not die"
    wait "${pids[$r]}" 2>/dev/null
    st=$?
    [[ $st == 137 ]] || fail "peer $r ended with $st, not killed: $(tail -5 "$tmp/a$r.log")"
    [[ -s $tmp/s$r ]] || fail "peer $r saved no state: $(tail -5 "$tmp/a$r.log")"
done
first=$(sed -n 's/^started at round \([0-9]*\)$/\1/p' "$tmp/a0.log")
[[ -n $first ]] || fail "no first round: $(cat "$tmp/a0.log")"
run_peers 2 "$tmp/b" "$py" "$here/state_peer.py" resume "$tmp/s{R}" "$tmp/x{R}" "${opts[@]}"
cat "$tmp"/b*.log
saved=$((first + 6))
for r in 0 1; do
    line=$(grep "^resumed at round" "$tmp/b$r.log") || fail "peer $r: $(cat "$tmp/b$r.log")"
    read -r at sv to rk < <(sed -E 's/^resumed at round ([0-9]+) \(saved ([0-9]+)\), ran [0-9]+ rounds to ([0-9]+), rank ([0-9]+)$/\1 \2 \3 \4/' <<<"$line")
    [[ $sv == "$saved" && $rk == "$r" && $to == $((first + 40)) ]] ||
        fail "peer $r: saved at $saved, rank $r, end $((first + 40)) expected: $line"
    ((at == saved)) || fail "peer $r resumed at round $at, saved at $saved"
done
"$py" - "$tmp" <<'PY' || fail "the resumed peers did not gossip"
import sys, numpy as np
x0, x1 = (np.fromfile(f"{sys.argv[1]}/x{r}", np.float32) for r in (0, 1))
gap = float(np.abs(x0 - x1).max())
print(f"final vectors: {x0[0]:.5f} and {x1[0]:.5f}, gap {gap:.3g}")
# Alone each would end at its rank (0 and 1); mixing keeps them within 0.1 of each other.
assert gap < 0.15 and 0.3 < x0[0] < 0.7, gap
PY
echo "ok: state saved at round $saved, killed at $((first + 10)), resumed at $at, ran to $((first + 40))"
