#!/usr/bin/env bash
# Link profiles: a two-cluster WAN with one slow peer resolves to the delays, rates and shared
# buckets it says, and every malformed profile is refused with a message naming the field.
#   test_profile.sh HEARSAY_WANEMU
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
emu=$1

cat >"$tmp/ok.json" <<'JSON'
{"name": "two clusters", "peers": 4, "rate_mbit": 1000, "delay_ms": 0.5,
 "clusters": [{"peers": [0, 1]}, {"peers": [2, 3]}],
 "between": {"delay_ms": 40, "rate_mbit": 50},
 "peer": [{"id": 3, "up_mbit": 25, "compute": 4}],
 "links": [{"from": 0, "to": 1, "rate_mbit": 10, "loss": 0.01}]}
JSON
out=$("$emu" --profile "$tmp/ok.json" --check) || fail "a valid profile was refused"
want() { grep -qx "$1" <<<"$out" || fail "--check lacks \"$1\"; it said: $out"; }
want "peers 4"
want "peer 3 up_mbit 25 down_mbit 1000 compute 4"
want "peer 0 up_mbit 1000 down_mbit 1000 compute 1"
want "pair 2 3 delay_ms 0.5 jitter_ms 0 loss 0 bucket -1 rate_mbit 0"
want "pair 0 1 delay_ms 0.5 jitter_ms 0 loss 0.01 bucket 2 rate_mbit 10"
want "pair 1 0 delay_ms 0.5 jitter_ms 0 loss 0 bucket -1 rate_mbit 0"
# Every pair from cluster 0 to cluster 1 shares one pipe (bucket 0), the way back another.
want "pair 0 2 delay_ms 40 jitter_ms 0 loss 0 bucket 0 rate_mbit 50"
want "pair 1 3 delay_ms 40 jitter_ms 0 loss 0 bucket 0 rate_mbit 50"
want "pair 3 0 delay_ms 40 jitter_ms 0 loss 0 bucket 1 rate_mbit 50"

# bad JSON-TEXT FIELD-IN-MESSAGE
bad() {
    printf '%s\n' "$1" >"$tmp/bad.json"
    local msg
    msg=$("$emu" --profile "$tmp/bad.json" --check 2>&1 >/dev/null)
    local rc=$?
    [[ $rc -eq 2 ]] || fail "profile $1: exit $rc, expected 2"
    grep -qF -- "$2" <<<"$msg" || fail "profile $1: message \"$msg\" does not name $2"
}
bad '{"delay_ms": 10}' 'peers'
bad '{"peers": 0}' 'peers'
bad '{"peers": 251}' 'peers'
bad '{"peers": 2, "dealy_ms": 10}' '"dealy_ms": unknown field'
bad '{"peers": 2, "delay_ms": -1}' 'delay_ms: -1'
bad '{"peers": 2, "delay_ms": "10"}' 'delay_ms: expected a number'
bad '{"peers": 2, "loss": 1}' 'loss: 1'
bad '{"peers": 2, "rate_mbit": -5}' 'rate_mbit'
bad '{"peers": 2, "mtu": 100}' 'mtu'
bad '{"peers": 2, "queue_ms": 0}' 'queue_ms'
bad '{"peers": 2, "between": {"delay_ms": 1}}' 'between'
bad '{"peers": 4, "clusters": [{"peers": [0, 1]}, {"peers": [1, 2]}]}' 'clusters[1].peers[0]: peer 1 is already in clusters[0]'
bad '{"peers": 4, "clusters": [{"peers": [0, 9]}]}' 'clusters[0].peers[1]: peer 9'
bad '{"peers": 4, "clusters": [{"peers": [0], "rate": 1}]}' 'clusters[0]."rate": unknown field'
bad '{"peers": 4, "clusters": [{"peers": [0]}], "between": {"loss": 2}}' 'between.loss'
bad '{"peers": 2, "peer": [{"id": 2}]}' 'peer[0].id: peer 2'
bad '{"peers": 2, "peer": [{"id": 1, "compute": 0.5}]}' 'peer[0].compute'
bad '{"peers": 2, "peer": [{"id": 1, "up_mbit": "x"}]}' 'peer[0].up_mbit'
bad '{"peers": 2, "links": [{"from": 0, "to": 0}]}' 'links[0]: from and to'
bad '{"peers": 2, "links": [{"from": 0}]}' 'links[0].to'
bad '{"peers": 2, "links": [{"from": 0, "to": 1, "both": 1}]}' 'links[0].both'
bad '{"peers": 2, "links": [{"from": 0, "to": 1, "jitter_ms": 1e9}]}' 'links[0].jitter_ms'
bad '{"peers": 2,' 'not valid JSON'
"$emu" --profile "$tmp/none.json" --check 2>"$tmp/err" && fail "a missing file was accepted"
grep -q "none.json" "$tmp/err" || fail "a missing file: message does not name it: $(cat "$tmp/err")"
for f in "$(dirname "${BASH_SOURCE[0]}")"/../../../examples/wan/profiles/*.json; do
    "$emu" --profile "$f" --check >/dev/null || fail "example profile $f is refused"
done
echo "ok: profiles resolve and bad fields are named"
