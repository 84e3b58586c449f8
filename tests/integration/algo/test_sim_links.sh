#!/usr/bin/env bash
# The simulator's link model through the real binary (hearsay sim --links, docs/WAN.md): what
# is asserted is virtual time, the numbers the simulator computed, never wall-clock time.
# Usage: test_sim_links.sh HEARSAY CASE
set -uo pipefail
hs=$1
case=$2
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
# A field of the metrics file's "done" record.
done_field() { grep '"event":"done"' "$1" | sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p"; }
common=(--synthetic --subset 800 --test-subset 100 --seed 3 --quiet)

case $case in
exchange)
    # Two peers, one D-PSGD round: each sends its model (B bytes) over links of rate R and
    # one-way delay D at the start of the round and waits for the other's after its local step
    # of S seconds, so the round ends at max(S, D + 8 B / R), to the float: D + 8 B / R with a
    # short step, S with a step long enough to hide the exchange. B is the payload with
    # --link-headers 0; by default each packet of at most 1448 payload bytes adds 52 (h = 52).
    echo '{"peers": 2, "rate_mbit": 8, "delay_ms": 30}' >"$tmp/p.json"
    for sh in 0.25:0 2:0 0.25:52; do
        s=${sh%:*} h=${sh#*:}
        hopt=()
        [[ $h -eq 0 ]] && hopt=(--link-headers 0)
        timeout 60 "$hs" sim -n 2 --algo dpsgd --rounds 1 --links "$tmp/p.json" --step-time $s \
            "${hopt[@]}" --metrics "$tmp/m$s.jsonl" "${common[@]}" >"$tmp/out" 2>&1 ||
            fail "sim failed: $(cat "$tmp/out")"
        cat "$tmp/out"
        grep -q "^final: .*; virtual time [0-9.]* s" "$tmp/out" || fail "no virtual time in the final line"
        b=$(done_field "$tmp/m$s.jsonl" bytes_sent)
        v=$(done_field "$tmp/m$s.jsonl" vtime)
        [[ -n $b && -n $v ]] || fail "no bytes_sent or vtime in the done record: $(tail -1 "$tmp/m$s.jsonl")"
        awk -v b="$b" -v v="$v" -v s=$s -v h=$h 'BEGIN { p = int((b + 1447) / 1448)
            x = 0.030 + 8 * (b + h * p) / 8e6; w = s > x ? s : x
            d = v - w; if (d < 0) d = -d
            printf "S = %g s, B = %d bytes, %d header bytes per packet: virtual time %.9f s, " \
                "expected %.9f s\n", s, b, h, v, w
            exit !(b > 1000 && d <= 1e-9 * w) }' ||
            fail "virtual time is not max(S, D + 8 (B + $h packets) / R)"
    done
    ;;
slow-link)
    # Four peers on a ring, fast links but one slow link between peers 0 and 1. D-PSGD waits
    # for it every round, so N rounds take at least N (D + 8 B / R) of the slow link; SGP that
    # never waits (--staleness 0) finishes sooner, below even that bound.
    cat >"$tmp/p.json" <<'JSON'
{"peers": 4, "rate_mbit": 1000, "delay_ms": 1,
 "links": [{"from": 0, "to": 1, "both": true, "rate_mbit": 2, "delay_ms": 50}]}
JSON
    n=6
    for a in dpsgd sgp; do
        timeout 60 "$hs" sim -n 4 --algo $a $([[ $a == sgp ]] && echo --staleness 0) --topology ring --rounds $n \
            --links "$tmp/p.json" --step-time 0.01 --metrics "$tmp/$a.jsonl" "${common[@]}" \
            >"$tmp/$a.out" 2>&1 || fail "$a failed: $(cat "$tmp/$a.out")"
        cat "$tmp/$a.out"
    done
    b=$(done_field "$tmp/dpsgd.jsonl" bytes_sent)
    vd=$(done_field "$tmp/dpsgd.jsonl" vtime)
    vs=$(done_field "$tmp/sgp.jsonl" vtime)
    [[ -n $b && -n $vd && -n $vs ]] || fail "no bytes_sent or vtime in the done records"
    # Per round, peer 0 sends one message (bytes_sent / n / 2 neighbours) over the slow link.
    awk -v b="$b" -v n=$n -v vd="$vd" -v vs="$vs" 'BEGIN { slow = n * (0.050 + 8 * b / n / 2 / 2e6)
        printf "d-psgd %.6f s, sgp %.6f s, %d rounds of the slow link %.6f s\n", vd, vs, n, slow
        exit !(vd >= slow * (1 - 1e-12) && vs < vd && vs < slow) }' ||
        fail "expected sgp < d-psgd and d-psgd >= the slow link's time"
    ;;
*) fail "unknown case $case" ;;
esac
