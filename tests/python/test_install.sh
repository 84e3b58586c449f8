#!/usr/bin/env bash
# The package installs from the tree without network: `pip install --no-build-isolation
# --no-deps` of a copy of python/ into a fresh virtual environment (system site packages for
# NumPy, setuptools and pip), then, from another directory, the installed package (not the
# tree's) loads the library named by HEARSAY_LIB, or found through LD_LIBRARY_PATH, and runs a
# one-peer job. Usage: test_install.sh (env: HEARSAY_LIB, HS_SOURCE_ROOT)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
need_python numpy pip setuptools
unset PYTHONPATH
# pip builds in the source directory: a copy keeps the checkout clean.
cp -r "$HS_SOURCE_ROOT/python" "$tmp/src"
"$py" -m venv --system-site-packages --without-pip "$tmp/venv" || fail "venv"
timeout 120 "$tmp/venv/bin/python" -m pip install --no-build-isolation --no-deps --no-index \
    "$tmp/src" >"$tmp/pip.log" 2>&1 || fail "pip install: $(tail -20 "$tmp/pip.log")"
cd "$tmp"
lib=$HEARSAY_LIB
check='
import sys, numpy as np, hearsay
assert hearsay.__file__.startswith(sys.prefix), hearsay.__file__
x = np.ones(10, np.float32)
with hearsay.Node(world=1, rounds=1, insecure=True, listen=sys.argv[1] + ":0", quiet=True) as n:
    n.start(x)
    assert n.step(x) is False
print("installed:", hearsay.__file__, "library:", hearsay.library_path())
'
timeout 60 "$tmp/venv/bin/python" -c "$check" "$ip" || fail "with HEARSAY_LIB"
# ld.so resolves the SONAME through LD_LIBRARY_PATH; HEARSAY_LIB unset.
ln -s "$lib" "$tmp/libhearsay.so.0"
HEARSAY_LIB= LD_LIBRARY_PATH=$tmp timeout 60 "$tmp/venv/bin/python" -c "$check" "$ip" ||
    fail "through LD_LIBRARY_PATH"
echo "ok: pip install --no-build-isolation --no-deps ./python"
