# Shared by the Python tests (sourced): a scratch directory, the peers a test started (killed by
# PID on exit), a loopback address of the test's own, and the skip when Debian's Python lacks
# NumPy (or PyTorch, for tests that need it).
# Usage: source lib.sh; needs $HEARSAY_LIB and $HS_SOURCE_ROOT in the environment (meson sets them).
py=/usr/bin/python3
# tmp, pids, cleanup (the EXIT trap) and fail come from the integration tests' common.sh.
source "$(dirname "${BASH_SOURCE[0]}")/../integration/common.sh"
need_python() { # need_python MODULE...: exit 77 (skip) when /usr/bin/python3 lacks one
    local m
    for m in "$@"; do
        "$py" -c "import $m" 2>/dev/null || {
            echo "SKIP: $py cannot import $m (tools/setup test installs python3-$m)"
            exit 77
        }
    done
}
export PYTHONPATH=$HS_SOURCE_ROOT/python
ip="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$(($$ % 250 + 2))"

# run_peers N LOGPREFIX CMD...: starts N copies of CMD with {R} in any argument replaced by the
# rank, waits for all with a deadline of 150 s; fails naming the peer that failed. The peers'
# PIDs are killed on exit. With IN_ORDER=1, each peer is started once the previous one is a
# member (its log says so: the peers must log at info level), so that peer ids equal ranks.
run_peers() {
    local n=$1 log=$2 r i a
    shift 2
    local start=${#pids[@]}
    for ((r = 0; r < n; r++)); do
        local args=()
        for a in "$@"; do args+=("${a//\{R\}/$r}"); done
        "${args[@]}" >"$log$r.log" 2>&1 &
        pids+=($!)
        [[ ${IN_ORDER:-0} == 1 ]] || continue
        local want="joined as peer $r "
        [[ $r == 0 ]] && want="wrote .* to "
        for _ in $(seq 300); do grep -q "$want" "$log$r.log" && break; sleep 0.1; done
        grep -q "$want" "$log$r.log" || fail "peer $r did not become member $r: $(tail -5 "$log$r.log")"
    done
    for ((r = 0; r < n; r++)); do
        i=$((start + r))
        timeout 150 tail --pid="${pids[$i]}" -f /dev/null ||
            fail "peer $r of $log did not finish: $(tail -5 "$log$r.log")"
        wait "${pids[$i]}" || fail "peer $r of $log failed: $(tail -5 "$log$r.log")"
    done
}
