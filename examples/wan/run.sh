#!/usr/bin/env bash
# Two datacenters over a WAN: 16 peers in two complete clusters of 8 joined by two bridge
# links, the bridges emulated at 50 ms delay and 10 Mbit/s by hearsay's own transport (the
# topology file topo/two-cluster-16-wan.json sets them per link). CHOCO-SGD with top-1% keeps the
# bridge traffic small. Expected: training proceeds at nearly the speed of a LAN run (a top-1%
# message is ~12 KB, 10 ms on a 10 Mbit/s link) and ends within a point of it; with
# --compress none the 0.94 MB messages take ~0.75 s on each bridge and the run slows down
# accordingly.
#   examples/wan/run.sh [extra hearsay launch flags]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
hs=${HEARSAY:-$here/../../build/hearsay}
extra=(--epochs 5)
[[ -n ${HEARSAY_EXAMPLE_SHORT:-} ]] && extra=(--synthetic --subset 8000 --rounds 10 --no-plot)
exec "$hs" launch --peers 16 --algo choco --compress topk:0.01 \
    --topology "$here/../../topo/two-cluster-16-wan.json" --name "wan-$(date +%Y%m%d-%H%M%S)" \
    "${extra[@]}" "$@"
