# shellcheck shell=bash disable=SC2154 # hs, epochs and seed are the caller's
# Shared by the outer-optimizer benches (run.sh, goal.sh): `run NAME FLAGS...` runs one
# `hearsay sim -n 8` and prints its mean and worst-peer accuracy and MB sent per peer (the
# sim's final line; "diverged at round R" when the guard stopped it), plus the bytes ratio to
# $base_mb when the caller has set it. Needs $hs, $epochs and $seed.
run() {
    local name=$1
    shift
    local out mean min mb
    out=$(OPENBLAS_NUM_THREADS=1 nice -n 10 "$hs" sim -n 8 --epochs "$epochs" --seed "$seed" \
        --quiet "$@" 2>&1)
    if ! grep -q '^final:' <<<"$out"; then
        printf '%-48s %s\n' "$name" "$(grep -m1 -o 'diverged at round [0-9]*' <<<"$out" || echo failed)"
        return
    fi
    out=$(grep '^final:' <<<"$out")
    mean=$(sed -n 's/.*mean \([0-9.]*\)%.*/\1/p' <<<"$out")
    min=$(sed -n 's/.* min \([0-9.]*\)%.*/\1/p' <<<"$out")
    mb=$(sed -n 's/.*; \([0-9.]*\) MB sent per peer.*/\1/p' <<<"$out")
    printf '%-48s mean %6s  worst %6s  MB/peer %9s' "$name" "$mean" "$min" "$mb"
    if [ -n "${base_mb:-}" ]; then
        awk -v b="$base_mb" -v m="$mb" 'BEGIN { printf "  1/%.0f", b / m }'
    else
        base_mb=$mb
    fi
    printf '\n'
}
