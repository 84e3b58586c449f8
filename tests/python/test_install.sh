#!/usr/bin/env bash
# The wheel carries the library. From a copy of the checkout, `pip wheel --no-build-isolation
# ./python` builds the package with its own libhearsay.so through meson-python (offline: the
# backend and NumPy come from Debian) and leaves the copy as it was (no python/build, no
# egg-info, no meson-python leftovers). The source is then removed, the wheel installed into a
# fresh virtual environment, and 2 processes of the installed package gossip to the average
# with no HEARSAY_LIB, no LD_LIBRARY_PATH and no PYTHONPATH: the package loads its own copy.
# HEARSAY_LIB still overrides it. The build runs once (about a minute on 2 cores).
# Usage: test_install.sh (env: HEARSAY_LIB, HS_SOURCE_ROOT)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
need_python numpy pip mesonpy
unset PYTHONPATH
command -v git >/dev/null || { echo "SKIP: no git to list the checkout's files"; exit 77; }
src=$tmp/src
mkdir -p "$src"
# The files of the checkout (tracked, and new ones not ignored), never its build directories.
(cd "$HS_SOURCE_ROOT" && git ls-files -z --cached --others --exclude-standard |
    xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh |
    tar --null -cf - -T -) | tar -xf - -C "$src" || fail "copying the checkout"
find "$src" -name __pycache__ -prune -exec rm -rf {} +
before=$(cd "$src" && find . | sort)
"$py" -m venv --system-site-packages "$tmp/build-venv" || fail "venv"
t0=$SECONDS
(cd "$tmp" && timeout 500 nice "$tmp/build-venv/bin/python" -m pip wheel --no-build-isolation \
    --no-deps --no-index -w "$tmp/wheel" "$src/python" >"$tmp/pip-wheel.log" 2>&1) ||
    fail "pip wheel: $(tail -30 "$tmp/pip-wheel.log")"
echo "wheel built in $((SECONDS - t0)) s: $(ls "$tmp/wheel")"
after=$(cd "$src" && find . -name __pycache__ -prune -o -print | sort)
[[ $before == "$after" ]] || fail "the build left files in the source tree: $(diff <(echo "$before") <(echo "$after"))"
whl=$(ls "$tmp"/wheel/hearsay-*.whl) || fail "no wheel"
"$py" -c 'import sys, zipfile; sys.exit("hearsay/libhearsay.so" not in zipfile.ZipFile(sys.argv[1]).namelist())' \
    "$whl" || fail "the wheel has no hearsay/libhearsay.so"
# Every module of the package (and py.typed) is in the wheel: python/meson.build lists them.
missing=$("$py" - "$whl" "$src/python/hearsay" <<'PY'
import os, sys, zipfile
have = {os.path.basename(n) for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.startswith("hearsay/")}
want = {f for f in os.listdir(sys.argv[2]) if f.endswith(".py") or f == "py.typed"}
print(" ".join(sorted(want - have)))
PY
) || fail "reading the wheel"
[[ -z $missing ]] || fail "the wheel lacks $missing (add them to python/meson.build)"
rm -rf "$src" "$tmp/build-venv"

"$py" -m venv --system-site-packages "$tmp/venv" || fail "venv"
timeout 120 "$tmp/venv/bin/python" -m pip install --no-deps --no-index "$whl" >"$tmp/pip.log" 2>&1 ||
    fail "pip install: $(tail -20 "$tmp/pip.log")"
mkdir -p "$tmp/run" && cd "$tmp/run"
cp "$here/avg_peer.py" .
vpy=$tmp/venv/bin/python
lib=$HEARSAY_LIB
unset HEARSAY_LIB LD_LIBRARY_PATH
run_peers 2 "$tmp/run/p" "$vpy" avg_peer.py --value {R} --expect 0.5 \
    algo=dpsgd world=2 rank={R} rounds=20 insecure=1 listen="$ip:0" rendezvous="$tmp/run/rv" \
    run-id="install-$$"
cat "$tmp"/run/p*.log
for r in 0 1; do
    grep -q "^library $tmp/venv/.*/hearsay/libhearsay.so rank $r " "$tmp/run/p$r.log" ||
        fail "peer $r did not load the installed package's own library: $(cat "$tmp/run/p$r.log")"
done
"$tmp/venv/bin/hearsay" --help >/dev/null ||
    fail "the wheel's hearsay command does not run"
# HEARSAY_LIB overrides the package's copy, also when it names nothing.
got=$(HEARSAY_LIB=$lib "$vpy" -c 'import hearsay; print(hearsay.library_path())') ||
    fail "with HEARSAY_LIB"
[[ $got == "$lib" ]] || fail "HEARSAY_LIB=$lib loaded $got"
out=$(HEARSAY_LIB=$tmp/nothing.so "$vpy" -c 'import hearsay; hearsay.library_path()' 2>&1) &&
    fail "a HEARSAY_LIB naming nothing was ignored"
[[ $out == *"$tmp/nothing.so"* ]] || fail "the error does not name HEARSAY_LIB's path: $out"
echo "ok: the wheel built by pip wheel --no-build-isolation ./python carries its library"
