#!/usr/bin/env bash
# hearsay launch --devices: peers go to the listed CUDA devices round-robin (peer i on
# cuda:LIST[i mod len], recorded in the run's config.json and passed as --device cuda:N), and
# bad lists or a contradicting --device are refused with exit 2 before any peer starts. Runs
# without a GPU: the peers are given a module that cannot load, so each exits at once.
#
#   test_launch_devices.sh HEARSAY_BINARY
set -uo pipefail

bin=$(realpath "${1:?usage: test_launch_devices.sh HEARSAY_BINARY}")
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

common=(--synthetic --epochs 1 --subset 600 --test-subset 200 --no-plot --runs-dir "$tmp/runs")

# 1. Refused at once, with the reason.
check_usage() {
    local want=$1
    shift
    timeout 30 "$bin" launch -n 2 "$@" "${common[@]}" >"$tmp/u.out" 2>&1
    local rc=$?
    if [[ $rc -ne 2 ]] || ! grep -q -- "$want" "$tmp/u.out"; then
        fail "launch $* exited $rc (expected 2 and '$want'):"
        cat "$tmp/u.out"
    else
        echo "ok: $*: $(tail -n 1 "$tmp/u.out")"
    fi
}
check_usage "'x' is not a CUDA device number" --devices 0,x
check_usage "'' is not a CUDA device number" --devices 0,,1
check_usage "'1024' is not a CUDA device number" --devices 1024
check_usage "cannot be combined with --device cpu" --devices 0,1 --device cpu
check_usage "cannot be combined with --device cuda:1" --devices 0 --device cuda:1

# 2. Three peers on two devices: 0, 1, 0. The module is a file that is not a shared object, so
#    every peer fails to open CUDA at once, whatever the machine has.
echo "not a shared object" >"$tmp/bogus.so"
HEARSAY_CUDA_MODULE="$tmp/bogus.so" timeout 120 "$bin" launch -n 3 --devices 0,1 --name rr \
    "${common[@]}" >"$tmp/rr.out" 2>&1
rc=$?
cfg="$tmp/runs/rr/config.json"
if [[ ! -f $cfg ]]; then
    fail "launch --devices 0,1 (exit $rc) wrote no $cfg:"
    cat "$tmp/rr.out"
else
    got=$("$py" -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c.get("devices"), "device" in c)' "$cfg")
    if [[ $got != "0,1 False" ]]; then
        fail "devices and shared --device in config.json: '$got' (expected '0,1 False')"
    else
        echo "ok: peers on cuda:0, cuda:1, cuda:0"
    fi
    for i in 0 1 2; do
        if ! grep -qE 'cannot load the CUDA backend|built without CUDA' "$tmp/runs/rr/peer-$i.log"; then
            fail "peer $i did not try CUDA:"
            cat "$tmp/runs/rr/peer-$i.log"
        fi
    done
fi

# 3. Without --devices, --device reaches every peer unchanged.
HEARSAY_CUDA_MODULE="$tmp/bogus.so" timeout 120 "$bin" launch -n 2 --device cuda:1 --name one \
    "${common[@]}" >"$tmp/one.out" 2>&1
got=$("$py" -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c["device"], "devices" in c)' "$tmp/runs/one/config.json" 2>&1)
if [[ $got != "cuda:1 False" ]]; then
    fail "--device cuda:1 without --devices: '$got' (expected 'cuda:1 False')"
else
    echo "ok: --device cuda:1 passed to every peer"
fi

if [[ $fails -ne 0 ]]; then
    echo "$fails check(s) failed"
    exit 1
fi
exit 0
