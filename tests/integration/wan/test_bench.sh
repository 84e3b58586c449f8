#!/usr/bin/env bash
# The WAN benchmark in short: 2 peers on the thin-WAN profile (20 Mbit/s, 100 ms RTT), DDP over
# gloo and hearsay (CHOCO-SGD top-5% fp16, named in the mode) through hearsay.torch, both run to
# their last step and both rows of the table are printed. Asserts that the runs finish and report,
# never their speed. First, without root: a mode's compressor and --overlap name its row.
#   test_bench.sh SOURCE_ROOT   (environment: HEARSAY_WANEMU, HEARSAY_LIB)
set -uo pipefail
src=$1
bench="$src/tools/bench/wan"
out=$(/usr/bin/python3 "$bench" --modes ddp:fp16 --from-json /dev/null 2>&1) &&
    { echo "FAIL: --modes ddp:fp16 (DDP has no compressor) was accepted"; exit 1; }
grep -q "unknown mode ddp:fp16" <<<"$out" || { echo "FAIL: $out"; exit 1; }
out=$(/usr/bin/python3 "$bench" --modes ddp@ring --from-json /dev/null 2>&1) &&
    { echo "FAIL: --modes ddp@ring (DDP has no topology) was accepted"; exit 1; }
grep -q "unknown mode ddp@ring" <<<"$out" || { echo "FAIL: $out"; exit 1; }
out=$(/usr/bin/python3 "$bench" \
    --modes ddp,dpsgd@exponential,choco:sign:512@hypercube,outer:choco@ring \
    --steps 96 --from-json /dev/null 2>&1) ||
    { echo "FAIL: MODE[:COMPRESS]@TOPOLOGY refused: $out"; exit 1; }
rows=$(mktemp) || exit 1
trap 'rm -f "$rows"' EXIT
row='"bench": "wan", "profile": "p", "n": 2, "steps": 10, "target": 50, "train_s": 9,
     "ip_bytes_per_peer": 1000000, "final_acc": 60, "cpu_busy_pct": 100, "load1": 1'
echo "{$row, \"mode\": \"ddp\", \"time_to_target_s\": 8}" | tr -d '\n' >"$rows"
echo >>"$rows"
echo "{$row, \"mode\": \"choco:topk:0.01:fp8\", \"overlap\": true, \"time_to_target_s\": 2,
      \"worst_acc\": 55}" |
    tr -d '\n' >>"$rows"
out=$(/usr/bin/python3 "$bench" --from-json "$rows" 2>&1) ||
    { echo "FAIL: --from-json: $out"; exit 1; }
grep -qE "^choco:topk:0.01:fp8\+overlap +2.0 .* 4.00x" <<<"$out" ||
    { echo "FAIL: no row choco:topk:0.01:fp8+overlap at 4.00x DDP's time in:"; echo "$out"
      exit 1; }
grep -qE "^choco:topk:0.01:fp8\+overlap .* 60.00% +55.00 " <<<"$out" ||
    { echo "FAIL: no worst peer's 55.00 after the mean's 60.00% in:"; echo "$out"; exit 1; }
[[ $(id -u) -eq 0 ]] || { echo "SKIP: needs root (network namespaces)"; exit 77; }
[[ -c /dev/net/tun ]] || { echo "SKIP: no /dev/net/tun"; exit 77; }
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "SKIP: no PyTorch for /usr/bin/python3"; exit 77; }
# 40 steps, not the issue's 100: DDP moves 0.83 MB per step over 20 Mbit/s, at least 0.33 s a
# step before latency, and 100 steps of both modes took about 2 minutes here.
out=$(timeout 200 /usr/bin/python3 "$bench" --n 2 --profiles thin-wan --steps 40 \
    --eval-every 20 --modes ddp,choco:topk:0.05:fp16 --target 50 --timeout 180 2>&1)
rc=$?
echo "$out"
[[ $rc -eq 0 ]] || { echo "FAIL: tools/bench/wan exited $rc"; exit 1; }
table=$(sed -n '/^profile thin-wan, n = 2, 40 steps/,$p' <<<"$out")
[[ -n $table ]] || { echo "FAIL: no table for thin-wan"; exit 1; }
for mode in ddp choco:topk:0.05:fp16; do
    # mode, time to target or -, train seconds, MB per peer, final accuracy
    grep -qE "^$mode +(-|[0-9.]+) +[0-9.]+ +[0-9.]+ +[0-9.]+%" <<<"$table" ||
        { echo "FAIL: the table has no $mode row"; exit 1; }
done
# hearsay's CHOCO (top-5% fp16) carried fewer bytes than DDP's all-reduce: a decision of the
# algorithm, not a timing.
awk '$1 == "ddp" {d = $4} $1 == "choco:topk:0.05:fp16" {c = $4} END {exit !(c < d)}' <<<"$table" ||
    { echo "FAIL: CHOCO top-5% fp16 sent no fewer bytes than DDP"; exit 1; }
echo "ok: both rows"
