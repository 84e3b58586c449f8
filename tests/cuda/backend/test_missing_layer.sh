#!/usr/bin/env bash
# A model the device cannot run (the backend lacks a layer's op: HS_ENOTSUP from the model) is a
# usage error: hearsay train, sim and run all print the layer and the device and exit 2, as for
# a bad flag. No real backend lacks a layer today, so the CUDA module is replaced by a stand-in
# with memory ops only (fake_cuda_module.c) through HEARSAY_CUDA_MODULE, which only a build with
# CUDA reads: elsewhere this skips (77).
#
#   test_missing_layer.sh HEARSAY_BINARY FAKE_MODULE
set -uo pipefail
bin=${1:?usage: test_missing_layer.sh HEARSAY_BINARY FAKE_MODULE}
mod=${2:?usage: test_missing_layer.sh HEARSAY_BINARY FAKE_MODULE}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! timeout 10 "$bin" --version | grep -q '^backends:.*cuda'; then
    echo "SKIP: this hearsay was built without CUDA (HEARSAY_CUDA_MODULE is not read)"
    exit 77
fi
export HEARSAY_CUDA_MODULE=$mod
fails=0
small=(--synthetic --subset 400 --test-subset 100 --device cuda)
need="--device cuda: linear is not implemented on this backend"
for cmd in "train --epochs 1" "sim -n 2 --rounds 2" "run --insecure --rounds 2"; do
    # shellcheck disable=SC2086 # the command and its own options are split on purpose
    timeout 60 "$bin" $cmd "${small[@]}" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [[ $rc -ne 2 ]]; then
        echo "FAIL: hearsay $cmd --device cuda (no layers): exit $rc, expected 2: $(cat "$tmp/err")"
        fails=$((fails + 1))
    elif ! grep -q -- "$need" "$tmp/err"; then
        echo "FAIL: hearsay $cmd: stderr does not name the missing layer: $(cat "$tmp/err")"
        fails=$((fails + 1))
    else
        echo "ok: hearsay $cmd --device cuda (no layers) -> exit 2: $(grep -m1 -- "$need" "$tmp/err")"
    fi
done
[[ $fails -eq 0 ]] || exit 1
