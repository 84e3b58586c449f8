#!/usr/bin/env bash
# libhearsay.so exports the public API and nothing else: its dynamic symbols (nm -D) are exactly
# the functions include/hearsay/*.h declares (tools/gen-export-map --list), and the version
# script src/libhearsay.map is the one generated from those headers. hearsay.pc keeps the
# dependencies private (Requires.private), so `pkg-config --cflags hearsay` does not need their
# -dev packages. Usage: test_exports.sh LIBHEARSAY SOURCE_ROOT BUILD_ROOT
set -uo pipefail
lib=$1
src=$2
build=$3
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
command -v nm >/dev/null || { echo "SKIP: no nm"; exit 77; }
"$src/tools/gen-export-map" --check || fail "src/libhearsay.map is out of date"
"$src/tools/gen-export-map" --list >"$tmp/declared" || fail "listing the public functions"
nm -D --defined-only "$lib" | awk '{ print $NF }' | sort -u >"$tmp/exported"
[[ $(wc -l <"$tmp/declared") -gt 100 ]] || fail "only $(wc -l <"$tmp/declared") public functions found"
extra=$(comm -13 "$tmp/declared" "$tmp/exported")
[[ -z $extra ]] || fail "exported but not declared in include/hearsay/: $extra"
missing=$(comm -23 "$tmp/declared" "$tmp/exported")
[[ -z $missing ]] || fail "declared in include/hearsay/ but not exported: $missing"
echo "ok: $(wc -l <"$tmp/exported") exported functions, all and only those of include/hearsay/"
pc=$build/meson-private/hearsay.pc
[[ -f $pc ]] || fail "no $pc"
grep -q '^Requires.private: .*libuv' "$pc" || fail "hearsay.pc has no Requires.private: $(cat "$pc")"
grep -q '^Requires:' "$pc" && fail "hearsay.pc makes its dependencies public: $(grep '^Requires:' "$pc")"
echo "ok: hearsay.pc: $(grep '^Requires.private' "$pc")"
