#!/usr/bin/env bash
# Runs one example of examples/ in its shortened form (HEARSAY_EXAMPLE_SHORT=1), in a scratch
# directory, bounded in time. Usage: test_examples.sh HEARSAY SOURCE_ROOT NAME
set -uo pipefail
hs=$(realpath "$1")
src=$(realpath "$2")
name=$3
tmp=$(mktemp -d)
# Every process an example starts carries $tmp in its arguments (its run directory is under
# it): nothing else on the machine (another checkout's tests) matches.
trap 'pkill -9 -f -- "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
cd "$tmp"
if [[ $name == pytorch ]] && ! /usr/bin/python3 -c 'import numpy, torch' 2>/dev/null; then
    echo "SKIP: /usr/bin/python3 lacks numpy or torch (tools/setup test installs them)"
    exit 77
fi
# Examples that listen on fixed ports get a loopback address of this test's own, so that runs
# of the suite in other checkouts on the same machine never collide with this one.
export HEARSAY=$hs HEARSAY_EXAMPLE_SHORT=1 CHURN_DIR=$tmp/runs/churn-test \
    HEARSAY_EXAMPLE_HOST="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$(($$ % 250 + 2))"
timeout 240 bash "$src/examples/$name/run.sh" >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
if [[ $rc -ne 0 ]]; then
    echo "FAIL: examples/$name/run.sh exited $rc"
    exit 1
fi
case $name in
quickstart | wan) grep -q '^summary: .* (0 failed); final test accuracy' "$tmp/out" || { echo "FAIL: no summary"; exit 1; } ;;
compression-sweep) [[ $(grep -c '%' "$tmp/out") -ge 7 ]] || { echo "FAIL: sweep incomplete"; exit 1; } ;;
non-iid) [[ $(grep -c '^.*final: test accuracy' "$tmp/out") -eq 2 ]] || { echo "FAIL: missing runs"; exit 1; } ;;
straggler) [[ $(grep -c '^summary:' "$tmp/out") -eq 2 ]] || { echo "FAIL: missing runs"; exit 1; } ;;
churn) [[ $(grep -c '^final: peer' "$tmp/out") -ge 4 ]] || { echo "FAIL: survivors did not finish"; exit 1; } ;;
pytorch) [[ $(grep -c '^peer [0-9]*: test accuracy' "$tmp/out") -eq 4 ]] || { echo "FAIL: not every peer finished"; exit 1; } ;;
esac
echo "ok: examples/$name"
