#!/usr/bin/env bash
# Integration test of the real `hearsay topo` binary (TAP): every shipped file in topo/ passes
# check; every file in broken/ is rejected with the exit code and reason listed in
# broken/EXPECT; gen -> check / show round trips for every generator; usage errors exit 2.
# Usage: topo_cli.sh HEARSAY SOURCE_ROOT. Each command runs under `timeout`; the scratch
# directory is removed on exit.
set -u
hs=$1
root=$2
here=$root/tests/integration/topo
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

n=0
failed=0
ok() {
    n=$((n + 1))
    echo "ok $n - $1"
}
not_ok() {
    n=$((n + 1))
    failed=$((failed + 1))
    echo "not ok $n - $1"
    shift
    local line
    for line in "$@"; do echo "# $line"; done
}
# run ARGS...: sets $out (stdout and stderr) and $rc.
run() {
    out=$(timeout 60 "$hs" "$@" 2>&1)
    rc=$?
}
# expect NAME CODE TEXT ARGS...: the command exits CODE and its output contains TEXT.
expect() {
    local name=$1 code=$2 text=$3
    shift 3
    run "$@"
    if [[ $rc -eq $code && $out == *"$text"* ]]; then
        ok "$name"
    else
        not_ok "$name" "command: hearsay $*" "expected exit $code and: $text" "got exit $rc:" \
            "${out:0:2000}"
    fi
}

# 1. Shipped topologies: each valid, with a computed spectral gap.
shipped=0
for f in "$root"/topo/*.json; do
    shipped=$((shipped + 1))
    expect "check $(basename "$f")" 0 "result        valid" topo check "$f"
    if [[ $out != *"spectral gap  "[0-9]* ]]; then not_ok "gap of $(basename "$f")" "$out"; fi
done
[[ $shipped -ge 9 ]] && ok "topo/ holds $shipped files" || not_ok "topo/ holds only $shipped files"
for name in ring-8 ring-16 torus-4x4 hypercube-16 exponential-16 complete-8 regular-16-d4 \
    two-cluster-16 two-cluster-16-wan; do
    [[ -f $root/topo/$name.json ]] && ok "ships $name.json" || not_ok "ships $name.json"
done
expect "check all shipped at once" 0 "two-cluster-16-wan.json: valid" topo check --quiet \
    "$root"/topo/*.json

# 2. Broken files: exit code and reason each.
listed=0
while IFS=$'\t' read -r file code text; do
    [[ -z $file || $file == \#* ]] && continue
    listed=$((listed + 1))
    expect "rejects broken/$file" "$code" "$text" topo check "$here/broken/$file"
done <"$here/broken/EXPECT"
files=$(ls "$here"/broken/*.json | wc -l)
[[ $listed -eq $files ]] && ok "every broken file is listed in EXPECT ($files)" ||
    not_ok "EXPECT lists $listed of $files broken files"

# 3. Unreadable input and usage errors: exit 2.
expect "missing file" 2 "cannot open" topo check "$tmp/nope.json"
mkdir -p "$tmp/dir.json"
expect "directory" 2 "not a regular file" topo check "$tmp/dir.json"
expect "check without a file" 2 "needs a topology file" topo check
expect "unknown option" 2 "unknown option" topo check --frobnicate "$root/topo/ring-8.json"
expect "unknown subcommand" 2 "unknown command 'frobnicate'" topo frobnicate
expect "topo without subcommand" 2 "usage: hearsay topo" topo
expect "gen without KIND" 2 "gen needs a KIND" topo gen
expect "gen without -n" 2 "give the number of peers" topo gen ring
expect "gen unknown kind" 2 "unknown kind 'star'" topo gen star -n 8
expect "gen hypercube not 2^k" 2 "12 peers is not a power of 2" topo gen hypercube -n 12
expect "gen regular odd n*D" 2 "n * D is odd" topo gen regular -n 9 --degree 3
expect "gen regular without degree" 2 "give --degree" topo gen regular -n 8
expect "gen --degree on ring" 2 "--degree applies to regular only" topo gen ring -n 8 --degree 3
expect "gen torus mismatch" 2 "4x4 is 16 peers, not 12" topo gen torus:4x4 -n 12
expect "gen bad -n" 2 "--peers 0: must be in 1..65536" topo gen ring -n 0
expect "gen too many bridges" 2 "5 bridges between clusters of 4 and 4" topo gen two-cluster \
    -n 8 --bridges 5
expect "gen bad --name" 2 "--name: topology name: character 0x0a" topo gen ring -n 4 \
    --name $'a\nb'
expect "show --round out of range" 2 "--round 4: the schedule has 4 rounds" topo show \
    "$root/topo/onepeer-exp-16.json" --round 4
expect "gen to an unwritable path" 1 "cannot create" topo gen ring -n 4 -o "$tmp/no/such/dir.json"
expect "help" 0 "usage: hearsay topo COMMAND" topo --help
expect "gen --help from the option table" 0 "--degree D" topo gen --help
expect "check --help" 0 "--no-gap" topo check --help
expect "show --help" 0 "--dot" topo show --help

expect "check --no-gap" 0 "spectral gap  not computed (--no-gap)" topo check --no-gap \
    "$root/topo/ring-8.json"
expect "check of a generator spec" 0 "spectral gap  0.195262" topo check ring -n 8
expect "check a schedule: gap of the product" 0 \
    "spectral gap  1 (|lambda_2| " topo check "$root/topo/onepeer-exp-16.json"
expect "no gap for a non-stochastic W" 1 "not computed (W is not non-negative and stochastic)" \
    topo check "$here/broken/row-sum.json"

# 4. Worst exit code over several files.
expect "valid + invalid -> 1" 1 "invalid" topo check --quiet "$root/topo/ring-8.json" \
    "$here/broken/disconnected.json"
expect "valid + unreadable -> 2" 2 "cannot open" topo check --quiet "$root/topo/ring-8.json" \
    "$tmp/nope.json"

# 5. gen -> check and show, with and without explicit weights, for every generator.
specs=("ring -n 7" "torus --rows 3 --cols 5" "torus -n 12" "hypercube -n 32" "exponential -n 12"
    "onepeer-exp -n 16" "onepeer-exp -n 10" "complete -n 9" "regular -n 20 --degree 3"
    "regular:6 -n 11" "two-cluster -n 10" "two-cluster -n 12 --bridges 3")
for s in "${specs[@]}"; do
    # shellcheck disable=SC2086
    set -- $s
    f=$tmp/gen.json
    g=$tmp/gen-w.json
    run topo gen "$@" -o "$f"
    [[ $rc -eq 0 ]] || {
        not_ok "gen $s" "$out"
        continue
    }
    expect "gen $s | check" 0 "result        valid" topo check "$f"
    run topo gen "$@" --weights -o "$g"
    a=$(timeout 60 "$hs" topo show "$f" 2>&1)
    b=$(timeout 60 "$hs" topo show "$g" 2>&1)
    if [[ $rc -eq 0 && -n $a && $a == "$b" ]] && grep -q '\[0, [0-9]*, 0\.' "$g"; then
        ok "gen $s --weights: same matrices as the default weights"
    else
        not_ok "gen $s --weights" "$a" "$b"
    fi
done
expect "gen regular is seeded" 0 "" topo gen regular -n 30 --degree 4 --seed 7 -o "$tmp/a.json"
run topo gen regular -n 30 --degree 4 --seed 7 -o "$tmp/b.json"
run topo gen regular -n 30 --degree 4 --seed 8 -o "$tmp/c.json"
cmp -s "$tmp/a.json" "$tmp/b.json" && ok "same seed, same graph" || not_ok "same seed differs"
cmp -s "$tmp/a.json" "$tmp/c.json" && not_ok "seeds 7 and 8 gave the same graph" ||
    ok "another seed, another graph"
expect "gen to stdout" 0 '"name": "ring-5"' topo gen ring -n 5
expect "gen --name" 0 '"name": "my ring"' topo gen ring -n 5 --name "my ring"

# 6. show and DOT.
expect "show lists neighbours" 0 "0  self 0.333333   -- 1:0.333333 7:0.333333" topo show \
    "$root/topo/ring-8.json"
expect "show lists link emulation" 0 "0 -> 8: delay=50ms,rate=10mbit" topo show \
    "$root/topo/two-cluster-16-wan.json"
expect "show a schedule round" 0 "0  self 0.5        <- 14:0.5  -> 2:0.5" topo show \
    "$root/topo/onepeer-exp-16.json" --round 1
expect "show --matrix" 0 "0.3333 0.3333 0.0000" topo show "$root/topo/ring-8.json" --matrix
expect "show of a spec" 0 "complete-4: 4 peers, undirected, static" topo show complete -n 4
expect "show --dot undirected" 0 '0 -- 1 [label="0.3333"];' topo show --dot \
    "$root/topo/ring-8.json"
[[ $out == 'graph "ring-8" {'* ]] && ok "DOT header" || not_ok "DOT header" "$out"
expect "show --dot directed schedule" 0 '0 -> 1 [label="t=0"];' topo show --dot \
    "$root/topo/onepeer-exp-16.json"
[[ $out == 'digraph "onepeer-exp-16" {'* ]] && ok "DOT digraph" || not_ok "DOT digraph" "$out"
expect "show a broken but well-formed file" 0 "peer" topo show "$here/broken/disconnected.json"

echo "1..$n"
exit $((failed > 0))
