#!/usr/bin/env bash
# Churn: a job of 4 peers that 2 more join mid-run (through any member's address, starting
# from the model they are welcomed with), and that one leaves (SIGTERM: it finishes its round,
# writes a checkpoint and says BYE) and one crashes (SIGKILL: its neighbours notice within the
# peer timeout). Every membership change takes effect at an agreed round; the survivors
# re-weight and finish. Expected: every surviving peer ends the run with a final accuracy line
# close to the others'; the logs show the joins, the leave and the crash.
#   examples/churn/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
hs=${HEARSAY:-$here/../../build/hearsay}
dir=${CHURN_DIR:-runs/churn-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$dir"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/secret"
chmod 600 "$dir/secret"
rounds=600
data=()
if [[ -n ${HEARSAY_EXAMPLE_SHORT:-} ]]; then
    rounds=300
    data=(--synthetic --subset 4000 --test-subset 500 --batch 64)
fi
common=(--secret-file "$dir/secret" --algo choco --compress topk:0.05 --rounds $rounds --world 6
    --peer-timeout 1500 --eval-every 100 "${data[@]}")
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
echo "churn: 4 peers start (logs in $dir)"
"$hs" run --listen 127.0.0.1:7470 --rank 0 --wait-peers 4 "${common[@]}" --metrics "$dir/peer-{id}.jsonl" \
    >"$dir/p0.out" 2>"$dir/p0.log" &
pids+=($!)
for i in 1 2 3; do
    "$hs" run --listen 127.0.0.1:$((7470 + i)) --bootstrap 127.0.0.1:7470 --rank $i --wait-peers 4 \
        "${common[@]}" --checkpoint-dir "$dir/ck$i" --metrics "$dir/peer-{id}.jsonl" \
        >"$dir/p$i.out" 2>"$dir/p$i.log" &
    pids+=($!)
done
sleep 2
echo "churn: 2 peers join through peer 1"
for i in 4 5; do
    "$hs" run --listen 127.0.0.1:$((7470 + i)) --bootstrap 127.0.0.1:7471 --rank $i "${common[@]}" \
        --metrics "$dir/peer-{id}.jsonl" >"$dir/p$i.out" 2>"$dir/p$i.log" &
    pids+=($!)
done
sleep 2
echo "churn: peer at rank 2 leaves (SIGTERM), peer at rank 3 crashes (SIGKILL)"
kill -TERM "${pids[2]}"
kill -KILL "${pids[3]}"
status=0
for i in 0 1 4 5; do wait "${pids[$i]}" || status=1; done
wait "${pids[2]}" || status=1
cat "$dir"/p*.out
grep -h "joined as\|left the run\|declared dead\|is no longer a member" "$dir"/p0.log | head -20 || true
exit $status
