#!/usr/bin/env bash
# tools/bench/wan_device.sh: the WAN benchmark (tools/bench/wan) at n = 8 on a lent machine with
# more cores than peers, which has PyTorch but none of hearsay's libraries, no ip/iperf3 perhaps,
# and no package registry. `pack` gathers here everything the run needs into one folder; `run`
# (the folder's run.sh) probes the machine, runs tools/wan --self-test and the benchmark there.
#
#   tools/bench/wan_device.sh pack DIR [BUILD]   # here; BUILD defaults to build/ (a CPU build)
#   bash DIR/run.sh                              # there, as root; output also under $OUT
#
# DIR gets bin/ (hearsay, hearsay-wanemu, libhearsay.so*, linktime_bench), libs.tar.xz (their
# shared libraries but glibc's), net.tar.xz (this machine's ip, tc, ping, iperf3 and their
# libraries, used there only where the machine's own are missing or fail), tree/ (tools/wan,
# tools/wan-selftest.sh, tools/bench/wan, examples/pytorch/fmnist.py, python/hearsay), data/
# (Fashion-MNIST), MANIFEST and run.sh.
#
# run's settings, from the environment (defaults in brackets):
#   WAN_N [8] WAN_STEPS [100] WAN_TARGET [70] WAN_EVAL [10]
#   WAN_PROFILES [thin-wan,wan,slow-peer,lan]   ('' for the probe and self-test alone) in this
#                 order, each if its estimate fits the time left: DDP against WAN_MODES_<P>
#                 [$WAN_MODES; slow-peer: sgp,dpsgd], with WAN_ARGS_<P> [$WAN_ARGS; slow-peer:
#                 without --overlap] (<P>: upper case, - as _). DDP's runs but the LAN's are
#                 link-bound (a few % of a core), so they all start first and run beside the
#                 others, unless WAN_SERIAL=1
#   WAN_MODES [choco:topk:0.01:fp8,choco]   hearsay modes (tools/bench/wan --modes)
#   WAN_ARGS [--overlap --option peer-timeout=10000 --option join-timeout=30000]
#   WAN_BUDGET [450]   seconds from the start after which nothing starts and every run is stopped
#   WAN_SKIP [1]   0: start a run even when its (rough, high) estimate exceeds the time left
#   WAN_SELFTEST [quick]   quick, full (adds the emulator's CPU at 100 Mbit/s) or skip
#   WAN_PYTHON    the python with torch [python3, /usr/bin/python3, /opt/torch/.venv/bin/python3]
#   WAN_SHADOW [1]   0: use every packed library even where the machine has its own
# Output (also under $OUT): run.log (everything), rows.jsonl (tools/bench/wan's rows), tables.txt,
# ddp.log (the background runs), load.log (load average every 5 s).
# Exit status: 3 when the machine cannot run it (the probe says why), 1 when a run failed.
set -uo pipefail

die() {
    echo "wan_device.sh: $*" >&2
    exit 2
}

# Shared libraries of the files given that are neither glibc's nor the GPU driver's.
libs_of() {
    local f
    for f in "$@"; do ldd "$f" 2>/dev/null | awk '$3 ~ /^\// { print $3 }'; done | sort -u |
        while read -r lib; do
            case $(basename "$lib") in
            libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libgcc_s.so* | \
                libstdc++.so* | libcuda* | libnv* | libhearsay*) ;;
            *) echo "$lib" ;;
            esac
        done
}

pack_main() {
    local o=${1:?usage: wan_device.sh pack DIR [BUILD]} self root b data t p f
    self=$(realpath "$0")
    root=$(cd "$(dirname "$self")/../.." && pwd)
    b=$(realpath "${2:-$root/build}")
    for f in hearsay libhearsay.so.0 tools/wanemu/hearsay-wanemu; do
        [[ -e $b/$f ]] || die "pack: $b has no $f (meson setup build && ninja -C build)"
    done
    data=${HEARSAY_FMNIST:-/usr/share/datasets/fashion-mnist}
    for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
        [[ -e $data/$f.gz ]] || die "pack: no $data/$f.gz (HEARSAY_FMNIST names the folder)"
    done
    rm -rf "$o"
    mkdir -p "$o/bin" "$o/libs" "$o/net/real" "$o/net/lib" "$o/tree/tools/bench" \
        "$o/tree/examples/pytorch" "$o/data/fashion-mnist"
    cp "$b/hearsay" "$b/tools/wanemu/hearsay-wanemu" "$o/bin/" || die "pack: copying the binaries"
    for f in "$b"/libhearsay.so.*; do [[ -d $f ]] || cp -P "$f" "$o/bin/"; done
    [[ -x $b/tools/bench/linktime_bench ]] && cp "$b/tools/bench/linktime_bench" "$o/bin/"
    libs_of "$o"/bin/* | while read -r f; do cp -L "$f" "$o/libs/"; done
    # OpenBLAS alone is 35 MB; as xz the libraries are a few MB (unpacked there).
    tar cJf "$o/libs.tar.xz" -C "$o" libs && rm -rf "$o/libs"
    for t in ip tc ping iperf3; do
        p=$(command -v "$t") || die "pack: no $t here to carry (apt-get install iproute2 iputils-ping iperf3)"
        cp -L "$p" "$o/net/real/$t"
    done
    libs_of "$o"/net/real/* | while read -r f; do cp -L "$f" "$o/net/lib/"; done
    tar cJf "$o/net.tar.xz" -C "$o" net && rm -rf "$o/net"
    cp "$root/tools/wan" "$root/tools/wan-selftest.sh" "$o/tree/tools/"
    cp "$root/tools/bench/wan" "$o/tree/tools/bench/"
    cp "$root/examples/pytorch/fmnist.py" "$o/tree/examples/pytorch/"
    mkdir -p "$o/tree/python/hearsay"
    cp "$root"/python/hearsay/*.py "$root/python/hearsay/py.typed" "$o/tree/python/hearsay/"
    cp "$data"/*-idx?-ubyte.gz "$o/data/fashion-mnist/"
    cp "$self" "$o/wan_device.sh"
    cat >"$o/run.sh" <<'SH'
#!/usr/bin/env bash
# Made by tools/bench/wan_device.sh pack: runs the WAN benchmark here (settings: that file's head).
exec bash "$(dirname "${BASH_SOURCE[0]}")/wan_device.sh" run "$@"
SH
    {
        echo "packed $(date -u +%FT%TZ) on $(uname -n) from $root at $(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
        (cd "$o" && find . -type f ! -name MANIFEST | sort | xargs sha256sum)
    } >"$o/MANIFEST"
    du -sh "$o" | awk '{ print "wan_device.sh: " $1 " in " $2 " (the device tool carries at most 64 MiB)" }'
}

# ---- run (on the lent machine) ----

say() { printf '[%4ds load %s] %s\n' $((SECONDS - t_start)) "$(cut -d' ' -f1 /proc/loadavg)" "$*"; }
left() { echo $((budget - (SECONDS - t_start))); }

cleanup() {
    local t k alive p ns
    trap '' INT TERM HUP
    # Each run is a session of its own (setsid timeout ...): TERM the group, whose tools/wan
    # then ends its peers and removes its namespaces; KILL what is left after 15 s.
    for t in "${groups[@]}"; do kill -TERM -- "-$t" 2>/dev/null; done
    for ((k = 0; k < 150; k++)); do
        alive=0
        for t in "${groups[@]}"; do kill -0 -- "-$t" 2>/dev/null && alive=1; done
        [[ $alive -eq 0 ]] && break
        sleep 0.1
    done
    for t in "${groups[@]}"; do kill -KILL -- "-$t" 2>/dev/null; done
    # Namespaces of ours that a killed tools/wan left: tools/bench/wan names them hswb<its
    # pid>-<k>, the self-test hswst<tools/wan's pid>-<tag>-<i>.
    for p in "${kids[@]}"; do
        for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^hsw(b|st)$p-"); do
            for k in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$k" 2>/dev/null; done
            ip netns del "$ns" 2>/dev/null && echo "wan_device.sh: removed namespace $ns left behind"
        done
    done
    [[ -n ${sampler:-} ]] && kill "$sampler" 2>/dev/null
    [[ -n $PY ]] && collect
    [[ -n ${work:-} ]] && rm -rf "$work"
    # Let tee write the last lines before $OUT is collected.
    exec >/dev/null 2>&1
    for ((k = 0; k < 30; k++)); do kill -0 "$teepid" 2>/dev/null || break; sleep 0.1; done
}

# launch LOG CMD...: CMD in a session of its own under `timeout` (the time left), output to LOG
# ('-': ours). Sets $last to its pid.
launch() {
    local log=$1 secs
    shift
    secs=$(left)
    if [[ $log == - ]]; then
        setsid timeout -k 15 "$secs" "$@" </dev/null &
    else
        setsid timeout -k 15 "$secs" "$@" >"$log" 2>&1 </dev/null &
    fi
    last=$!
    groups+=("$last")
    sleep 0.3
    local k
    for k in $(pgrep -P "$last"); do kids+=("$k"); done
}

# A rough upper estimate of one run's seconds: start-up, then per step DDP's ring of 2 (n - 1)
# steps of two one-way delays and bytes / n each (tools/bench/wan's CNN, 206,922 floats), or a
# gossip step; the slow-peer profile computes 4x slower on one peer.
estimate() { # PROFILE MODES
    awk -v p="$1" -v modes="$2" -v n="$N" -v s="$STEPS" 'BEGIN {
        d["lan"] = 0.0005; r["lan"] = 1000; d["regional"] = 0.01; r["regional"] = 100
        d["wan"] = 0.05; r["wan"] = 100; d["thin-wan"] = 0.05; r["thin-wan"] = 20
        d["two-clusters"] = 0.04; r["two-clusters"] = 50; d["slow-peer"] = 0.01; r["slow-peer"] = 100
        d["slow-link"] = 0.05; r["slow-link"] = 10
        if (!(p in r)) { d[p] = 0.05; r[p] = 10 } # a profile not listed: the slowest link
        slow = p == "slow-peer" ? 4 : 1; t = 0; k = split(modes, m, ",")
        for (i = 1; i <= k; i++) {
            if (m[i] == "ddp")
                t += 25 + s * (2 * (n - 1) * (2 * d[p] + 8 * 4 * 206922 / n * 1.04 / (r[p] * 1e6)) + 0.08 * slow)
            else
                t += 25 + s * (m[i] ~ /^sgp/ ? 0.12 : 0.12 * slow)
        }
        printf "%d\n", t }'
}

# tool_ok NAME: whether NAME (as PATH finds it) does what tools/wan needs; why not in probe.err.
tool_ok() {
    local ns=hswprobe$$ rc
    command -v "$1" >/dev/null || { echo "not found" >"$work/probe.err"; return 1; }
    case $1 in
    ip)
        { ip netns add "$ns" && ip netns exec "$ns" ip link set lo up &&
            ip netns exec "$ns" ip tuntap add dev hswp0 mode tun; } 2>"$work/probe.err"
        rc=$?
        ip netns del "$ns" 2>/dev/null
        return $rc
        ;;
    ping) ping -n -c 1 -W 2 127.0.0.1 >"$work/probe.err" 2>&1 ;;
    iperf3) iperf3 --version >"$work/probe.err" 2>&1 ;;
    tc) tc -V >"$work/probe.err" 2>&1 ;;
    esac
}

probe() {
    local ok=1 t
    say "probe: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), kernel $(uname -r), $(lscpu 2>/dev/null | awk -F: '/Model name/ {gsub(/^ +/, "", $2); print $2; exit}')"
    say "probe: uptime: $(uptime)"
    command -v nvidia-smi >/dev/null && say "probe: $(nvidia-smi -L 2>/dev/null | head -1) (not used: the peers are CPU peers)"
    head -1 "$g/MANIFEST"
    for t in ip tc ping iperf3 chrt setsid timeout ldd pgrep sysctl gnuplot; do
        printf '  %-7s %s\n' "$t" "$(command -v "$t" || echo MISSING)"
    done
    for t in setsid timeout pgrep; do
        command -v "$t" >/dev/null || { say "PROBE FAILED: no $t"; return 3; }
    done
    # Libraries: the packed ones, but where the machine has a library of the same name, its own
    # (newer, and what its python already uses), unless the binaries then miss a symbol.
    [[ -d $g/libs ]] || tar xJf "$g/libs.tar.xz" -C "$g" || { say "PROBE FAILED: libs.tar.xz"; return 3; }
    [[ -d $g/net ]] || tar xJf "$g/net.tar.xz" -C "$g" || { say "PROBE FAILED: net.tar.xz"; return 3; }
    # A copy that lost the modes (the device tool's transfer) must still run.
    chmod +x "$g"/bin/* "$T/tools/wan" "$T/tools/bench/wan" "$g"/net/real/* 2>/dev/null
    mkdir -p "$g/libs.sys"
    # Without ldd nothing says whether the machine's own would do: every packed one then.
    command -v ldd >/dev/null || ldd() { :; }
    if [[ ${WAN_SHADOW:-1} == 1 ]] && command -v ldd | grep -q /; then
        ldconfig -p >"$work/ldconfig.txt" 2>/dev/null # a file: grep -q would cut the pipe
        for t in "$g"/libs/*; do
            grep -q "^[[:space:]]*$(basename "$t") " "$work/ldconfig.txt" && mv "$t" "$g/libs.sys/"
        done
    fi
    export LD_LIBRARY_PATH=$g/bin:$g/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    ldd "$g"/bin/* >"$work/ldd.txt" 2>&1
    if grep -q 'not found' "$work/ldd.txt"; then
        mv "$g"/libs.sys/* "$g/libs/" 2>/dev/null
        say "probe: the machine's own libraries miss symbols; using every packed one"
    fi
    say "probe: packed libraries in use: $(ls "$g/libs" | tr '\n' ' ')"
    ldd "$g"/bin/* >"$work/ldd.txt" 2>&1
    if grep 'not found' "$work/ldd.txt"; then say "PROBE FAILED: a library is missing (above)"; return 3; fi
    # ip, ping, iperf3, tc: the machine's own where they work, else this pack's (Debian 12), run
    # through the dynamic loader so that their libraries do not reach the programs they start.
    mkdir -p "$g/net/bin" "$g/net/first"
    for t in ip tc ping iperf3; do
        printf '#!/bin/sh\nexec /lib64/ld-linux-x86-64.so.2 --library-path "%s" "%s" "$@"\n' \
            "$g/net/lib" "$g/net/real/$t" >"$g/net/bin/$t"
        chmod +x "$g/net/bin/$t"
    done
    export PATH=$g/net/first:$g/bin:$PATH
    [[ -c /dev/net/tun ]] || { modprobe tun 2>/dev/null; mkdir -p /dev/net; mknod /dev/net/tun c 10 200 2>/dev/null; }
    [[ -c /dev/net/tun ]] || { say "PROBE FAILED: no /dev/net/tun and mknod failed"; ok=0; }
    [[ $(id -u) -eq 0 ]] || { say "PROBE FAILED: not root (namespaces need it)"; return 3; }
    for t in ip tc ping iperf3; do
        if ! tool_ok "$t"; then
            say "probe: $t: $(command -v "$t" || echo missing): $(tr '\n' ' ' <"$work/probe.err" | cut -c1-200); trying the packed one"
            ln -sf "$g/net/bin/$t" "$g/net/first/$t"
            hash -r
            tool_ok "$t" || { say "PROBE FAILED: $t: $(tr '\n' ' ' <"$work/probe.err" | cut -c1-300)"; ok=0; }
        fi
    done
    [[ $ok -eq 1 ]] && say "probe: namespace + TUN ok; ip $(command -v ip), ping $(command -v ping), iperf3 $(command -v iperf3)"
    say "probe: TCP congestion control $(cat /proc/sys/net/ipv4/tcp_congestion_control) (allowed: $(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control)); DDP's ring times depend on it"
    # The data where hearsay.datasets looks for it (DEFAULT_DIR).
    local dd=/usr/share/datasets/fashion-mnist
    if [[ ! -e $dd/train-images-idx3-ubyte.gz && ! -e $dd/train-images-idx3-ubyte ]]; then
        mkdir -p "$(dirname "$dd")" && rm -rf "$dd" && ln -s "$g/data/fashion-mnist" "$dd" &&
            say "probe: $dd -> the pack's copy"
    fi
    PY=''
    for t in ${WAN_PYTHON:-} python3 /usr/bin/python3 /opt/torch/.venv/bin/python3; do
        command -v "$t" >/dev/null && "$t" -c 'import torch, numpy' 2>/dev/null && { PY=$(command -v "$t"); break; }
    done
    [[ -n $PY ]] || { say "PROBE FAILED: no python with torch and numpy (WAN_PYTHON)"; return 3; }
    if ! "$PY" -c 'import sys, torch, numpy, hearsay.torch, fmnist
from hearsay import _lib, datasets
x, y = datasets.fashion_mnist(train=False, subset=10)
print("  python", sys.version.split()[0], "torch", torch.__version__, "numpy", numpy.__version__,
      "hearsay", _lib.lib()._hearsay_path, "test images", x.shape)' 2>&1; then
        say "PROBE FAILED: $PY cannot import torch + hearsay.torch or read the data (above)"
        return 3
    fi
    [[ $ok -eq 1 ]] || return 3
    # hearsay.torch under this machine's torch and numpy, in seconds: two peers on loopback,
    # CHOCO top-1% fp8 with overlap, 3 rounds of the benchmark's CNN.
    local r pids=() rc=0
    for r in 0 1; do
        timeout 90 "$PY" -c 'import sys, torch, fmnist, hearsay.torch
rank, d = int(sys.argv[1]), sys.argv[2]
torch.set_num_threads(1)
(x, y), _ = fmnist.load(rank, 2, subset=512, test_subset=10)
m = fmnist.cnn(seed=1)
opt = fmnist.sgd(m)
g = hearsay.torch.Gossip(m, overlap=True, algo="choco", compress="topk:0.01:fp8", world=2,
                         rank=rank, rendezvous=d + "/rv", insecure=True, listen="127.0.0.1:0",
                         rounds=3, quiet=True)
g.start()
for i in range(3):
    fmnist.local_step(m, opt, x[i * 64:(i + 1) * 64], y[i * 64:(i + 1) * 64])
    g.step()
print("  hearsay.torch peer", rank, "bytes sent", g.metrics()["bytes_sent"])
g.close()' "$r" "$work" &
        pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r" || rc=$?; done
    [[ $rc -eq 0 ]] || { say "PROBE FAILED: two hearsay.torch peers on loopback (exit $rc, above)"; return 3; }
    say "probe: ok"
}

selftest() {
    local mode=${WAN_SELFTEST:-quick} rc
    [[ $mode == skip ]] && return 0
    say "self-test ($mode): tools/wan --self-test$([[ $mode == quick ]] && echo ' --quick')"
    local q=()
    [[ $mode == quick ]] && q=(--quick)
    launch - "$T/tools/wan" --self-test "${q[@]}"
    wait "$last"
    rc=$?
    say "self-test exited $rc"
    # A figure off is a result; an emulator that cannot run makes every later run fail too.
    [[ $rc -eq 0 || $rc -eq 1 ]] || { say "the emulator does not work here: stopping"; return 3; }
}

# bench NAME LOG PROFILE MODES ARGS...: one tools/bench/wan run.
bench() {
    local name=$1 log=$2 p=$3 modes=$4 e
    shift 4
    e=$(estimate "$p" "$modes")
    if [[ $(left) -lt 20 || ($e -gt $(left) && ${WAN_SKIP:-1} == 1) ]]; then
        say "$name: skipped (estimate $e s, $(left) s left of WAN_BUDGET)"
        return 0
    fi
    say "$name: tools/bench/wan --profiles $p --modes $modes (estimate $e s, $(left) s left)"
    launch "$log" "$PY" "$T/tools/bench/wan" --n "$N" --steps "$STEPS" --target "$TARGET" \
        --eval-every "$EVAL" --timeout "$(left)" --profiles "$p" --modes "$modes" \
        --json "$work/rows-$name.jsonl" "$@"
}

wait_run() { # NAME PID
    local rc
    wait "$2"
    rc=$?
    say "$1: exited $rc$([[ $rc -eq 124 ]] && echo ' (stopped at WAN_BUDGET)')"
    [[ $rc -eq 0 ]] || failed=1
}

# collect: every finished run's rows (DDP's first) into $out/rows.jsonl, the background runs'
# logs into $out/ddp.log, and the tables of the rows; once, also after a TERM or the budget.
collect() {
    [[ $collected -eq 0 && -n ${work:-} && -d $work ]] || return 0
    collected=1
    local f
    for f in "$work"/ddp-*.log; do
        [[ -e $f ]] && { echo "=== $(basename "$f")"; cat "$f"; } >>"$out/ddp.log"
    done
    for f in ${profiles//,/ }; do cat "$work/rows-ddp-$f.jsonl" "$work/rows-$f.jsonl"; done 2>/dev/null >"$out/rows.jsonl"
    if [[ -s $out/rows.jsonl ]]; then
        say "the tables of every finished run (DDP/mode: DDP's time to target over the mode's):"
        timeout 60 "$PY" "$T/tools/bench/wan" --from-json "$out/rows.jsonl" | tee "$out/tables.txt"
    else
        say "no run finished: no rows"
    fi
}

# The modes and arguments of PROFILE's foreground run (without DDP): WAN_MODES_<P> and
# WAN_ARGS_<P> where set; the slow peer's defaults are the modes that do not wait for it.
profile_modes() {
    local v=${1^^}
    v=WAN_MODES_${v//-/_}
    if [[ -n ${!v:-} ]]; then echo "${!v}"; elif [[ $1 == slow-peer ]]; then echo sgp,dpsgd; else echo "$modes"; fi
}
profile_args() { # sets pargs
    local v=${1^^} x
    v=WAN_ARGS_${v//-/_}
    pargs=()
    if [[ -n ${!v+x} ]]; then
        read -ra pargs <<<"${!v}"
    elif [[ $1 == slow-peer ]]; then
        for x in "${args[@]}"; do [[ $x == --overlap ]] || pargs+=("$x"); done
    else
        pargs=("${args[@]}")
    fi
}

run_main() {
    g=$(cd "$(dirname "$(realpath "$0")")" && pwd)
    [[ -e $g/bin/hearsay && -d $g/tree ]] || die "run: $g is not a pack (tools/bench/wan_device.sh pack DIR, then bash DIR/run.sh)"
    T=$g/tree
    out=${OUT:-$(mktemp -d /tmp/hswdev-out.XXXXXX)}
    mkdir -p "$out"
    work=$(mktemp -d /tmp/hswdev.XXXXXX)
    t_start=$SECONDS groups=() kids=() failed=0 sampler='' last='' collected=0 PY=''
    exec > >(tee -a "$out/run.log") 2>&1
    teepid=$!
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    budget=${WAN_BUDGET:-450} N=${WAN_N:-8} STEPS=${WAN_STEPS:-100} TARGET=${WAN_TARGET:-70}
    EVAL=${WAN_EVAL:-10}
    modes=${WAN_MODES:-choco:topk:0.01:fp8,choco}
    local p bg=() pids=() names=() k
    profiles=${WAN_PROFILES-thin-wan,wan,slow-peer,lan} # empty: the probe and self-test alone
    read -ra args <<<"${WAN_ARGS---overlap --option peer-timeout=10000 --option join-timeout=30000}"
    say "wan_device.sh run: output in $out; n=$N steps=$STEPS target=$TARGET eval=$EVAL profiles=$profiles modes=$modes budget=${budget}s args=${args[*]}"
    export HEARSAY=$g/bin/hearsay HEARSAY_WANEMU=$g/bin/hearsay-wanemu \
        HEARSAY_LIB=$g/bin/libhearsay.so.0 HEARSAY_LINKTIME_BENCH=$g/bin/linktime_bench \
        PYTHONPATH=$T/python:$T/examples/pytorch${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 \
        OPENBLAS_NUM_THREADS=1
    probe || exit 3
    (while sleep 5; do echo "$(date -u +%T) +$((SECONDS - t_start))s load $(cut -d' ' -f1-3 /proc/loadavg)"; done) >"$out/load.log" 2>&1 &
    sampler=$!
    selftest || exit 3
    # DDP's runs first, in the background: a step waits out 2 (n - 1) ring steps on the link and
    # computes for a few % of it, so they hardly load the cores the foreground runs use. Not on
    # the LAN, where DDP's step is compute and the emulator's 1 Gbit/s.
    for p in ${profiles//,/ }; do
        [[ ${WAN_SERIAL:-0} == 1 || $p == lan ]] && continue
        profile_args "$p"
        bench "ddp-$p" "$work/ddp-$p.log" "$p" ddp "${pargs[@]}"
        [[ -n $last ]] && { pids+=("$last"); names+=("ddp-$p"); bg+=("$p"); }
        last=''
    done
    for p in ${profiles//,/ }; do
        local m
        m=$(profile_modes "$p")
        [[ " ${bg[*]} " == *" $p "* ]] || m=ddp,$m
        profile_args "$p"
        bench "$p" - "$p" "$m" "${pargs[@]}"
        [[ -n $last ]] && wait_run "$p" "$last"
        last=''
    done
    for ((k = 0; k < ${#pids[@]}; k++)); do
        say "waiting for ${names[$k]} (its log: ddp.log)"
        wait_run "${names[$k]}" "${pids[$k]}"
        grep -E '^(ddp|tools/bench/wan|Traceback|---)' "$work/${names[$k]}.log" | tail -5
    done
    collect
    say "uptime: $(uptime)"
    say "done: $([[ $failed -eq 0 ]] && echo 'every run exited 0' || echo 'a run failed (above)'); files: $(ls "$out" | tr '\n' ' ')"
    return $failed
}

case ${1:-} in
pack) shift; pack_main "$@" ;;
run) shift; run_main "$@"; exit $? ;;
*) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; [[ ${1:-} == -h || ${1:-} == --help ]] || exit 2 ;;
esac
