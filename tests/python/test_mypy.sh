#!/usr/bin/env bash
# The package's types: mypy --strict over python/hearsay (py.typed ships them to users), with
# Debian's mypy, NumPy and PyTorch stubs. Skips (77) without mypy.
# Usage: test_mypy.sh (env: HS_SOURCE_ROOT)
set -uo pipefail
command -v mypy >/dev/null || { echo "SKIP: no mypy (tools/setup test installs it)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$HS_SOURCE_ROOT/python" || exit 1
[[ -f hearsay/py.typed ]] || { echo "FAIL: no hearsay/py.typed"; exit 1; }
timeout 240 mypy --strict --cache-dir "$tmp" hearsay || { echo "FAIL: mypy --strict"; exit 1; }
echo "ok: mypy --strict python/hearsay"
