# tools/wan --self-test [--quick] (sourced by tools/wan): runs ping and iperf3 through the
# emulator under small profiles and compares what they measure with what was configured:
# round-trip delays within 1 ms or 5% (whichever is larger), TCP rates within 5% of the goodput
# the configured IP rate allows, round-trip loss inside a binomial 99.9% (Wilson) interval.
# Prints every figure; also the emulator's CPU time while it carries 100 Mbit/s. Returns 1 when
# a figure is off, 0 when all are within bounds.
# shellcheck shell=bash
# shellcheck disable=SC2154 # self and emu are tools/wan's, which sources this file

st_off=0
st_report() { # NAME CONFIGURED MEASURED DETAIL OK(0/1)
    printf '%-34s configured %-16s measured %-16s %s  %s\n' "$1" "$2" "$3" "$4" \
        "$([[ $5 -eq 1 ]] && echo ok || echo OFF)"
    [[ $5 -eq 1 ]] || st_off=$((st_off + 1))
}

# The program each peer runs: MODE DIR [args]. Peer 0 measures, the others serve or idle.
st_peer_script() {
    cat <<'PEER'
mode=$1 out=$2
i=$HEARSAY_WAN_INDEX
cpu() { awk '{print $14 "," $15}' "/proc/$HEARSAY_WAN_EMU_PID/stat"; }
case $mode in
ping)
    count=$3 interval=$4
    [[ $i -eq 0 ]] || exit 0
    for ((j = 2; j <= HEARSAY_WAN_PEERS; j++)); do
        ping -n -q -c "$count" -i "$interval" -W 2 "10.77.0.$j" >"$out/ping$j.txt" 2>&1
        [[ $? -le 1 ]] || exit 1
    done
    ;;
iperf)
    secs=$3
    if [[ $i -eq 1 ]]; then
        # Serves until peer 0 is done (a one-off server would be spent by a failed attempt).
        iperf3 -s -B 10.77.0.2 >"$out/server.txt" 2>&1 &
        for ((k = 0; k < 600; k++)); do
            [[ -e $out/done ]] && break
            sleep 0.1
        done
        kill $!
        exit 0
    fi
    [[ $i -eq 0 ]] || exit 0
    rc=1
    for ((k = 0; k < 50 && rc != 0; k++)); do
        sleep 0.1
        c0=$(cpu) t0=$(date +%s.%N)
        timeout $((secs + 15)) iperf3 -c 10.77.0.2 --connect-timeout 1000 -t "$secs" -O 1 -J \
            >"$out/iperf.json" 2>/dev/null
        rc=$?
    done
    c1=$(cpu) t1=$(date +%s.%N)
    echo "$c0 $c1 $t0 $t1 $(getconf CLK_TCK)" >"$out/cpu.txt"
    touch "$out/done"
    exit $rc
    ;;
esac
PEER
}

# st_run NAME PROFILE_JSON MODE ARGS...: one driver run in namespaces of its own.
st_run() {
    local tag=$1 prof=$2
    shift 2
    printf '%s\n' "$prof" >"$st_dir/$tag.json"
    "$self" --profile "$st_dir/$tag.json" --name "$st_prefix-$tag" --timeout 60 --emu "$emu" \
        -- bash "$st_dir/peer.sh" "$@" || {
        echo "self-test: the $tag run failed" >&2
        return 1
    }
}

# Mean RTT (ms) and counts from a ping summary: "sent received avg".
st_ping() {
    awk '/packets transmitted/ {s = $1; r = $4} /^rtt/ {split($4, a, "/"); avg = a[2]}
         END {print s + 0, r + 0, avg + 0}' "$1"
}

st_delay() {
    local count=$1 prof s r avg want ok
    # Peer 0 to 1 over the default, 0 to 2 over a pair link of its own, 0 to 3 asymmetric.
    prof='{"name": "self-test delay", "peers": 4, "delay_ms": 20,
           "links": [{"from": 0, "to": 2, "delay_ms": 5, "both": true},
                     {"from": 0, "to": 3, "delay_ms": 30}, {"from": 3, "to": 0, "delay_ms": 10}]}'
    st_run delay "$prof" ping "$st_dir" "$count" 0.02 || return 1
    for pair in "2 40" "3 10" "4 40"; do
        set -- $pair
        read -r s r avg <<<"$(st_ping "$st_dir/ping$1.txt")"
        want=$2
        ok=$(awk -v m="$avg" -v w="$want" -v r="$r" 'BEGIN {t = w * 0.05; if (t < 1) t = 1;
             d = m - w; if (d < 0) d = -d; print (r > 0 && d <= t) ? 1 : 0}')
        st_report "RTT peer 0 <-> $(($1 - 1))" "$want.00 ms" "$avg ms" "($r pings, bound max(1 ms, 5%))" "$ok"
    done
}

st_rate() {
    local tag=$1 mbit=$2 secs=$3 prof bps want ok c0 c1 t0 t1 tck
    prof="{\"name\": \"self-test rate\", \"peers\": 2, \"delay_ms\": 5, \"rate_mbit\": $mbit}"
    rm -f "$st_dir/done"
    st_run "$tag" "$prof" iperf "$st_dir" "$secs" || return 1
    # Any python reads the JSON: Debian's here, a lent machine may have only another one.
    bps=$("$(command -v /usr/bin/python3 python3 | head -1)" -c 'import json,sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"])' "$st_dir/iperf.json" 2>/dev/null) || bps=0
    # The bucket counts IP bytes; TCP carries 1448 of every 1500 (IP, TCP and timestamp
    # headers), which is what iperf3 reports.
    want=$(awk -v r="$mbit" 'BEGIN {printf "%.2f", r * 1448 / 1500}')
    ok=$(awk -v m="$bps" -v w="$want" 'BEGIN {d = m / 1e6 - w; if (d < 0) d = -d; print (d <= 0.05 * w) ? 1 : 0}')
    st_report "TCP rate at $mbit Mbit/s (iperf3)" "$want Mbit/s" \
        "$(awk -v m="$bps" 'BEGIN {printf "%.2f", m / 1e6}') Mbit/s" "(goodput of $mbit Mbit/s IP, $secs s, bound 5%)" "$ok"
    read -r c0 c1 t0 t1 tck <"$st_dir/cpu.txt"
    # user,system ticks: most of the time is the kernel's (TUN reads and writes, and inside
    # each write the receiving namespace's IP and TCP input).
    st_cpu=$(awk -v a="$c0" -v b="$c1" -v s="$t0" -v e="$t1" -v k="$tck" 'BEGIN {
        split(a, x, ","); split(b, y, ","); u = (y[1] - x[1]) / k; y2 = (y[2] - x[2]) / k
        printf "%.1f%% of one core (user %.1f%%, kernel %.1f%%)", 100 * (u + y2) / (e - s),
            100 * u / (e - s), 100 * y2 / (e - s)}')
}

st_loss() {
    local count=$1 prof s r p
    p=0.05
    prof="{\"name\": \"self-test loss\", \"peers\": 2, \"delay_ms\": 1, \"loss\": $p, \"seed\": 7}"
    st_run loss "$prof" ping "$st_dir" "$count" 0.005 || return 1
    read -r s r _ <<<"$(st_ping "$st_dir/ping2.txt")"
    # A ping is lost when its request or its reply is: 1 - (1 - p)^2.
    awk -v s="$s" -v r="$r" -v p="$p" 'BEGIN {
        q = 1 - (1 - p) ^ 2; z = 3.29; ph = s > 0 ? (s - r) / s : 1
        c = (ph + z * z / (2 * s)) / (1 + z * z / s)
        h = z / (1 + z * z / s) * sqrt(ph * (1 - ph) / s + z * z / (4 * s * s))
        printf "%.4f %.4f %.4f %.4f %d\n", q, ph, c - h, c + h, (s > 0 && q >= c - h && q <= c + h)
    }' >"$st_dir/loss.txt"
    read -r q ph lo hi ok <"$st_dir/loss.txt"
    st_report "round-trip loss, $p each way" "$q" "$ph" "($s pings, 99.9% interval $lo..$hi)" "$ok"
}

selftest_main() {
    local quick=$1
    st_dir=$(mktemp -d /tmp/hswan-st.XXXXXX)
    st_prefix=hswst$$
    st_cpu=
    trap 'rm -rf "$st_dir"' EXIT
    command -v ping >/dev/null || { echo "self-test: needs ping (iputils-ping)" >&2; return 2; }
    command -v iperf3 >/dev/null || { echo "self-test: needs iperf3" >&2; return 2; }
    st_peer_script >"$st_dir/peer.sh"
    if [[ $quick -eq 1 ]]; then
        st_delay 15 && st_rate rate 40 2 && st_loss 400 || st_off=$((st_off + 1))
    else
        st_delay 50 && st_rate rate 50 5 && st_loss 2000 && st_rate cpu 100 5 || st_off=$((st_off + 1))
        echo "emulator CPU at 100 Mbit/s (one TCP flow, MTU 1500): $st_cpu ($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
    fi
    [[ -n $st_cpu && $quick -eq 1 ]] && echo "emulator CPU at 40 Mbit/s: $st_cpu"
    echo "self-test: $st_off figure(s) off"
    [[ $st_off -eq 0 ]]
}
