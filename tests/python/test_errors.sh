#!/usr/bin/env bash
# Failures of the C library reach Python as exceptions carrying the C message: a wrong shared
# secret (the job's member refuses the TLS handshake), a peer that refuses the connection
# (nothing listens at the bootstrap address), a member that refuses a peer of another algorithm
# and an invalid option. For each, node_peer (C) and
# node_peer.py fail the same way and the Python exception's text is the C message.
# Usage: test_errors.sh NODE_PEER (env: HEARSAY_LIB, HS_SOURCE_ROOT)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
need_python numpy
cpeer=$1
printf 'the-right-secret-of-this-test-0123456789' >"$tmp/good"
printf 'a-wrong-secret-for-this-test-9876543210' >"$tmp/bad"
chmod 600 "$tmp/good" "$tmp/bad"

# A member of a 2-peer job that waits for its second peer (it is killed at the end).
"$cpeer" --dim 100 --out "$tmp/x0" world=2 rank=0 rounds=5 listen=$ip:0 \
    rendezvous="$tmp/rv" secret-file="$tmp/good" join-timeout=60000 quiet=1 >"$tmp/member.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -s $tmp/rv ]] && break; sleep 0.1; done
[[ -s $tmp/rv ]] || fail "the member wrote no rendezvous file: $(cat "$tmp/member.log")"

# expect NAME EXCEPTION OPTIONS...: both drivers fail; Python raises EXCEPTION whose text holds
# the C driver's message (addresses aside).
expect() {
    local name=$1 exc=$2
    shift 2
    timeout 60 "$cpeer" --dim 100 --out "$tmp/xc" "$@" >"$tmp/$name.c" 2>&1 &&
        fail "$name: the C driver succeeded"
    timeout 60 "$py" - "$exc" "$tmp/$name.c" "$@" >"$tmp/$name.py" 2>&1 <<'PY' ||
import re, sys, numpy as np, hearsay
exc, clog, opts = sys.argv[1], open(sys.argv[2]).read(), dict(a.split("=", 1) for a in sys.argv[3:])
x = np.zeros(100, np.float32)
try:
    with hearsay.Node(opts) as n:
        n.start(x)
        while n.step(x):
            pass
except hearsay.Error as e:
    print(f"{type(e).__name__}: {e}")
    assert type(e).__name__ == exc, f"raised {type(e).__name__}, expected {exc}"
    # The same failure, up to the addresses (a joiner listens on a fresh port each time).
    addr = lambda t: re.sub(r"\d+\.\d+\.\d+\.\d+:\d+", "ADDR", t)  # noqa: E731
    assert e.message and addr(e.message) in addr(clog), f"the C driver said: {clog}"
    sys.exit(0)
sys.exit("no exception")
PY
        fail "$name: $(cat "$tmp/$name.py")"
    echo "ok: $name: $(tail -1 "$tmp/$name.py")"
}
expect wrong-secret AuthError world=2 rank=1 rounds=5 listen=$ip:0 rendezvous="$tmp/rv" \
    secret-file="$tmp/bad" join-timeout=3000 quiet=1
# Nothing listens at port 1 of this test's own loopback address.
expect refused ConnectionFailed world=2 rank=1 rounds=5 listen=$ip:0 bootstrap=$ip:1 \
    secret-file="$tmp/good" join-timeout=2000 quiet=1
# The member refuses a peer of another algorithm (HELLO carries it).
expect mismatch ConnectionFailed world=2 rank=1 rounds=5 algo=dpsgd listen=$ip:0 \
    rendezvous="$tmp/rv" secret-file="$tmp/good" join-timeout=3000 quiet=1
expect bad-option InvalidArgument compress=topk:2.5x
kill -0 "${pids[0]}" || fail "the member died: $(cat "$tmp/member.log")"
