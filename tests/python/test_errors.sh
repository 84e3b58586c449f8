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

# node.py EXCEPTION CLOG OPTIONS...: one Python node; exit 0 when it raises EXCEPTION whose text
# holds the C driver's message in the file CLOG (addresses aside; "-": not compared).
cat >"$tmp/node.py" <<'PY'
import re, sys, numpy as np, hearsay
exc, clog, opts = sys.argv[1], sys.argv[2], dict(a.split("=", 1) for a in sys.argv[3:])
x = np.zeros(100, np.float32)
try:
    with hearsay.Node(opts) as n:
        n.start(x)
        while n.step(x):
            pass
except hearsay.Error as e:
    print(f"{type(e).__name__}: {e}")
    assert type(e).__name__ == exc, f"raised {type(e).__name__}, expected {exc}"
    if clog != "-":
        # The same failure, up to the addresses (a joiner listens on a fresh port each time).
        clog = open(clog).read()
        addr = lambda t: re.sub(r"\d+\.\d+\.\d+\.\d+:\d+", "ADDR", t)  # noqa: E731
        assert e.message and addr(e.message) in addr(clog), f"the C driver said: {clog}"
    sys.exit(0)
sys.exit("no exception")
PY

# expect NAME EXCEPTION OPTIONS...: both drivers fail; Python raises EXCEPTION whose text holds
# the C driver's message (addresses aside).
expect() {
    local name=$1 exc=$2
    shift 2
    timeout 60 "$cpeer" --dim 100 --out "$tmp/xc" "$@" >"$tmp/$name.c" 2>&1 &&
        fail "$name: the C driver succeeded"
    timeout 60 "$py" "$tmp/node.py" "$exc" "$tmp/$name.c" "$@" >"$tmp/$name.py" 2>&1 ||
        fail "$name: $(cat "$tmp/$name.py")"
    echo "ok: $name: $(tail -1 "$tmp/$name.py")"
}
# Nothing listens at port 1 of this test's own loopback address.
expect refused ConnectionFailed world=2 rank=1 rounds=5 listen=$ip:0 bootstrap=$ip:1 \
    secret-file="$tmp/good" join-timeout=2000 quiet=1
# The member refuses a peer of another algorithm (HELLO carries it).
expect mismatch ConnectionFailed world=2 rank=1 rounds=5 algo=dpsgd listen=$ip:0 \
    rendezvous="$tmp/rv" secret-file="$tmp/good" join-timeout=3000 quiet=1
expect bad-option InvalidArgument compress=topk:2.5x
kill -0 "${pids[0]}" || fail "the member died: $(cat "$tmp/member.log")"

# A wrong secret, against a member of a 2-peer job that waits for its second peer: the joiner
# raises AuthError (C: exits with HS_EAUTH) and so does the member, neither waiting out its
# timeouts (10 minutes here: only the authentication verdict ends them) and each with a few
# log lines. Once a Python member with a C joiner, once the other way round.
lines() { grep -vc '^$' "$1"; }
for member in py c; do
    rv="$tmp/rv-$member"
    mopts=(world=2 rank=0 rounds=5 listen=$ip:0 rendezvous="$rv" secret-file="$tmp/good"
        join-timeout=600000)
    jopts=(world=2 rank=1 rounds=5 listen=$ip:0 rendezvous="$rv" secret-file="$tmp/bad"
        join-timeout=600000)
    if [[ $member == py ]]; then
        timeout 120 "$py" "$tmp/node.py" AuthError - "${mopts[@]}" >"$tmp/ws-member.log" 2>&1 &
    else
        timeout 120 "$cpeer" --dim 100 --out "$tmp/xm" "${mopts[@]}" >"$tmp/ws-member.log" 2>&1 &
    fi
    mpid=$!
    pids+=($mpid)
    for _ in $(seq 100); do [[ -s $rv ]] && break; sleep 0.1; done
    [[ -s $rv ]] || fail "wrong secret: the member wrote no rendezvous file: $(cat "$tmp/ws-member.log")"
    t0=$(date +%s.%N)
    if [[ $member == py ]]; then
        timeout 120 "$cpeer" --dim 100 --out "$tmp/xj" "${jopts[@]}" >"$tmp/ws-joiner.log" 2>&1 &&
            fail "wrong secret: the C joiner succeeded"
        grep -q "HS_EAUTH" "$tmp/ws-joiner.log" ||
            fail "wrong secret: the C joiner did not fail with HS_EAUTH: $(tail -2 "$tmp/ws-joiner.log")"
    else
        timeout 120 "$py" "$tmp/node.py" AuthError - "${jopts[@]}" >"$tmp/ws-joiner.log" 2>&1 ||
            fail "wrong secret: the Python joiner: $(tail -2 "$tmp/ws-joiner.log")"
    fi
    tj=$(date +%s.%N)
    wait "$mpid"
    rc=$?
    tm=$(date +%s.%N)
    if [[ $member == py ]]; then
        [[ $rc -eq 0 ]] || fail "wrong secret: the Python member (exit $rc): $(tail -2 "$tmp/ws-member.log")"
    else
        [[ $rc -ne 0 ]] && grep -q "HS_EAUTH" "$tmp/ws-member.log" ||
            fail "wrong secret: the C member (exit $rc): $(tail -2 "$tmp/ws-member.log")"
    fi
    for f in joiner member; do
        n=$(lines "$tmp/ws-$f.log")
        [[ $n -le 10 ]] || fail "wrong secret: the $f logged $n lines: $(head -20 "$tmp/ws-$f.log")"
    done
    # How long each side took from the joiner's start: a measure for issue 21's "within 5 s",
    # not asserted (the suite runs on a shared machine; the timeouts above are 10 minutes).
    echo "ok: wrong secret ($member member): joiner's error after" \
        "$(awk -v a="$t0" -v b="$tj" 'BEGIN { printf "%.1f", b - a }') s, the member's after" \
        "$(awk -v a="$t0" -v b="$tm" 'BEGIN { printf "%.1f", b - a }') s"
    echo "    joiner: $(tail -1 "$tmp/ws-joiner.log")"
    echo "    member: $(tail -1 "$tmp/ws-member.log")"
done
