# Shared preamble of the shell test drivers (sourced, never run):
#   source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
# Provides:
#   tmp      a fresh scratch directory, removed on exit (kept, and its path printed, when
#            KEEP_TMP is set in the environment: a debugging aid).
#   pids     an empty array; append the PID of every process the script starts ($!). Each is
#            killed with SIGKILL on exit.
#   cleanup  the EXIT trap (installed here): kills $pids, then removes or keeps $tmp.
#   fail     fail MESSAGE...: prints "FAIL: MESSAGE" and exits 1 (through cleanup).
#   wait_for SECONDS CMD...: polls CMD every 0.1 s until it succeeds; 1 on time out.
#   last_round FILE: the newest round a metrics file records (0 when none).
#   started FILE: the peer whose stderr is FILE logged its first round.
# Optional hooks, which the script may define before or after sourcing this (bash looks a
# function up when it is called):
#   cleanup_pid PID  called for each PID just before it is killed (e.g. its children first).
#   cleanup_extra    called once every PID has been killed, before $tmp goes.
#   fail_extra MSG.. called by fail after the FAIL line, before exiting (diagnostics).
tmp=$(mktemp -d)
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do
        declare -F cleanup_pid >/dev/null && cleanup_pid "$p"
        kill -9 "$p" 2>/dev/null
    done
    declare -F cleanup_extra >/dev/null && cleanup_extra
    if [[ -n ${KEEP_TMP:-} ]]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    declare -F fail_extra >/dev/null && fail_extra "$@"
    exit 1
}
wait_for() {
    local n=$(($1 * 10))
    shift
    for _ in $(seq "$n"); do
        "$@" && return 0
        sleep 0.1
    done
    return 1
}
last_round() {
    local r
    r=$(grep -o '"round":[0-9]*' "$1" 2>/dev/null | tail -1 | cut -d: -f2)
    echo "${r:-0}"
}
started() { grep -q "starting at round" "$1" 2>/dev/null; }
