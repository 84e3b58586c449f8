#!/usr/bin/env bash
# Three `hearsay run` processes on loopback: TLS with a shared secret, each on a free port, found
# through a rendezvous file (no fixed port to collide with a parallel test), CHOCO-SGD with
# top-10% on a small synthetic run, logging at info so that loop threads log while each peer
# names itself. Every peer runs all its rounds, exits 0 with its final line, and the three have
# ids 0, 1 and 2. The ThreadSanitizer stage of tools/setup test runs it on an instrumented
# binary, where a data race makes a peer exit non-zero. Usage: test_run_peers.sh HEARSAY
set -uo pipefail
hs=$1
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
fail_extra() { # each peer's stderr after the FAIL line
    for f in "$tmp"/p*.err; do
        echo "== $f"
        tail -40 "$f"
    done
}

printf 'run-peers-test-secret-0123456789abcdef' >"$tmp/secret"
chmod 600 "$tmp/secret"
rounds=40
# Generous timeouts: this test checks a run, not failure detection, and may run instrumented
# on a busy machine.
common=(--listen 127.0.0.1:0 --rendezvous "$tmp/rv" --secret-file "$tmp/secret" --run-id "rp-$$"
    --peer-timeout 30000 --join-timeout 60000 --recv-timeout 60000 --world 3 --wait-peers 3
    --synthetic --subset 600 --test-subset 200 --hidden 32 --batch 16 --rounds $rounds
    --compress topk:0.1 --eval-every 20 --metrics "$tmp/m{id}.jsonl")
for r in 0 1 2; do
    HEARSAY_LOG=info "$hs" run --rank $r "${common[@]}" >"$tmp/p$r.out" 2>"$tmp/p$r.err" &
    pids+=($!)
done
for r in 0 1 2; do
    timeout 240 tail --pid="${pids[$r]}" -f /dev/null || fail "peer of rank $r still running after 240 s"
    wait "${pids[$r]}"
    rc=$?
    ! grep -q "ThreadSanitizer" "$tmp/p$r.err" || fail "peer of rank $r: ThreadSanitizer report"
    [[ $rc -eq 0 ]] || fail "peer of rank $r exited $rc"
done
ids=()
for r in 0 1 2; do
    line=$(grep '^final: peer' "$tmp/p$r.out") || fail "peer of rank $r printed no final line"
    echo "$line"
    read -r id first end < <(sed -n 's/^final: peer \([0-9]*\) .*, rounds \([0-9]*\)\.\.\([0-9]*\),.*/\1 \2 \3/p' <<<"$line")
    [[ -n $id && $((end - first)) -eq $rounds ]] || fail "peer of rank $r: not $rounds rounds: $line"
    [[ -s $tmp/m$id.jsonl ]] || fail "peer $id wrote no metrics"
    ids+=("$id")
done
[[ $(printf '%s\n' "${ids[@]}" | sort -n | tr '\n' ' ') == "0 1 2 " ]] || fail "peer ids ${ids[*]}, expected 0 1 2"
echo "ok: 3 peers ran $rounds rounds each and stopped cleanly"
