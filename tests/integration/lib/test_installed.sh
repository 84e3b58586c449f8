#!/usr/bin/env bash
# The installed library as a user gets it: `meson install --destdir`, then a program outside the
# tree (gossip.c) built with `pkg-config --cflags --libs hearsay` only, run as 3 peers on
# loopback with TLS: they join and their vectors reach consensus. Also checks that
# libhearsay.so has a SONAME, exports only hs_ names, and that every public header is installed.
# Usage: test_installed.sh BUILD_ROOT SOURCE_ROOT
set -uo pipefail
build=$1
src=$2
here=$src/tests/integration/lib
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

timeout 120 meson install -C "$build" --destdir "$tmp/dest" --no-rebuild >"$tmp/install.log" 2>&1 ||
    fail "meson install: $(tail -5 "$tmp/install.log")"
pc=$(find "$tmp/dest" -name hearsay.pc | head -1)
[[ -n $pc ]] || fail "no hearsay.pc installed"
export PKG_CONFIG_PATH=$(dirname "$pc")
prefix=$(pkg-config --variable=prefix hearsay)
flags=(--define-variable=prefix="$tmp/dest$prefix")
libdir=$(pkg-config "${flags[@]}" --variable=libdir hearsay)
includedir=$(pkg-config "${flags[@]}" --variable=includedir hearsay)
echo "installed: $pc, libdir $libdir"

# Every public header is installed, and nothing else.
diff <(cd "$src/include/hearsay" && ls) <(cd "$includedir/hearsay" && ls) ||
    fail "installed headers differ from include/hearsay/"

lib=$libdir/libhearsay.so
[[ -e $lib ]] || fail "no $lib"
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
[[ $soname == libhearsay.so.0 ]] || fail "SONAME is '$soname', expected libhearsay.so.0"
nm -D --defined-only "$lib" | awk '{ print $NF }' >"$tmp/exports"
bad=$(grep -v '^hs_[a-zA-Z0-9]' "$tmp/exports" | head -20)
[[ -z $bad ]] || fail "libhearsay.so exports names outside the API: $bad"
grep -qx hs_algo_new "$tmp/exports" || fail "hs_algo_new is not exported"
echo "exports: $(wc -l <"$tmp/exports") names, all hs_"

cflags=$(pkg-config "${flags[@]}" --cflags hearsay) && libs=$(pkg-config "${flags[@]}" --libs hearsay) ||
    fail "pkg-config hearsay"
# shellcheck disable=SC2086
cc -std=gnu17 -Wall -Wextra -Werror -o "$tmp/gossip" "$here/gossip.c" $cflags $libs -lm \
    >"$tmp/cc.log" 2>&1 || fail "building outside the tree failed: $(cat "$tmp/cc.log")"
export LD_LIBRARY_PATH=$libdir
# (grep reads the whole output: with pipefail, grep -q closing early could fail the pipeline)
grep "$libdir/libhearsay.so.0" <(ldd "$tmp/gossip") >/dev/null || fail "gossip does not load the installed library"

# 3 peers, TLS with a shared secret, on a loopback address of this test's own.
ip="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$(($$ % 250 + 2))"
printf 'installed-library-test-secret-0123456789' >"$tmp/secret"
chmod 600 "$tmp/secret"
common=(--secret-file "$tmp/secret" --world 3 --rounds 30 --dim 1000)
"$tmp/gossip" --listen "$ip:7390" --rank 0 --out "$tmp/x0" "${common[@]}" >"$tmp/p0.log" 2>&1 &
pids+=($!)
for r in 1 2; do
    "$tmp/gossip" --listen "$ip:$((7390 + r))" --bootstrap "$ip:7390" --rank $r --out "$tmp/x$r" \
        "${common[@]}" >"$tmp/p$r.log" 2>&1 &
    pids+=($!)
done
for i in 0 1 2; do
    timeout 90 tail --pid="${pids[$i]}" -f /dev/null || fail "peer $i did not finish: $(cat "$tmp/p$i.log")"
    wait "${pids[$i]}" || fail "peer $i failed: $(cat "$tmp/p$i.log")"
done
cat "$tmp"/p*.log
"$tmp/gossip" --check 1000 3 "$tmp/x0" "$tmp/x1" "$tmp/x2" || fail "no consensus"
echo "ok: installed library, 3 TLS peers reached consensus"
