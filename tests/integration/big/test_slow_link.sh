#!/usr/bin/env bash
# A large model over an emulated slow link: two peers of 25M parameters (100 MB D-PSGD
# messages) at 1 Gbit/s (0.8 s a message), a job stopped with a checkpoint, resumed, and joined
# by a new peer that gets the model in its WELCOME (tools/bench/big/join_round.sh). A round's
# compute is far shorter than its message's time on the link, so the joiner's second message
# found its first still queued and was not sent (the queue's limit); its later round then filled
# the other peer's mailbox, whose reads paused. That peer waited for the dropped round until its
# receive timeout (10 minutes here), reading nothing meanwhile, not even heartbeats: both were
# "cut off from the job" after 47 s, every run. A dropped round then counted as lost at once
# (src/net/mailbox.c); now D-PSGD waits for its last message to be out before it builds the
# next (hs_exchange_ops.wait_room; test_slow_uplink.sh asserts no message is refused), so the
# rounds here go at the link's pace, and what this checks is that the resumed job over the slow
# link runs its rounds and ends. Bounded by `timeout`; join_round.sh kills its peers.
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
