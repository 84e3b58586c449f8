#!/usr/bin/env bash
# hearsay sim --cpu-peers: refused where it cannot mean anything, on every machine. (A mixed
# job itself is test_cuda_round's test_sim_mixed_peers.) Usage: test_cpu_peers.sh HEARSAY
set -uo pipefail
hs=$1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# Each case: the arguments and the words the refusal must contain.
check() {
    local want=$1
    shift
    timeout 30 "$hs" sim --synthetic -n 3 --rounds 1 "$@" >"$out" 2>&1
    local rc=$?
    [[ $rc -eq 2 ]] || fail "sim $*: exit $rc, expected 2: $(cat "$out")"
    grep -q -- "$want" "$out" || fail "sim $*: no '$want' in: $(cat "$out")"
    cat "$out"
}
check "use --device cuda" --cpu-peers 1
# Past the CPU check only where a device opens; the list is checked there (test_cuda_round
# under cuda-emu covers it): here, that the flag is documented.
"$hs" sim --help >"$out" 2>&1 || fail "sim --help failed"
grep -q -- "--cpu-peers I,J" "$out" || fail "--cpu-peers missing from sim --help"
echo "ok"
