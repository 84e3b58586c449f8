#!/usr/bin/env bash
# A large model over an emulated slow link: two peers of 25M parameters (100 MB D-PSGD
# messages) at 1 Gbit/s (0.8 s a message), a job stopped with a checkpoint, resumed, and joined
# by a new peer that gets the model in its WELCOME (tools/bench/big/join_round.sh). A round's
# compute is far shorter than its message's time on the link, so the joiner's second message
# finds its first still queued and is not sent (the queue's limit); its later round then fills
# the other peer's mailbox, whose reads pause. That peer waited for the dropped round until its
# receive timeout (10 minutes here), reading nothing meanwhile, not even heartbeats: both were
# "cut off from the job" after 47 s, every run. Now the dropped round counts as lost at once
# (src/net/mailbox.c) and the job ends. Bounded by `timeout`; join_round.sh kills its peers.
# Usage: test_slow_link.sh BUILD_DIR
set -uo pipefail
build=$1
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
out=$(RATES=1gbit ROUNDS=3 timeout 150 bash "$src/tools/bench/big/join_round.sh" "$build" 25000000 2>&1)
rc=$?
echo "$out"
[[ $rc -eq 0 ]] || { echo "FAIL: join_round.sh exited $rc (124: the job stalled)"; exit 1; }
grep -qE '^25000000 +1gbit +[0-9.]+ +[0-9.]+' <<<"$out" || { echo "FAIL: no row for 1gbit"; exit 1; }
echo "ok: a resumed 25M job over 1 Gbit/s finished its rounds"
