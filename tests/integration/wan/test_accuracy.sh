#!/usr/bin/env bash
# The emulated links are what the profile says: tools/wan --self-test --quick measures RTTs
# with ping, a TCP rate with iperf3 and round-trip loss, and exits non-zero when a figure is
# outside its bound (docs/WAN.md).
#   test_accuracy.sh TOOLS_WAN   (environment: HEARSAY_WANEMU)
set -uo pipefail
[[ $(id -u) -eq 0 ]] || { echo "SKIP: needs root (network namespaces)"; exit 77; }
[[ -c /dev/net/tun ]] || { echo "SKIP: no /dev/net/tun"; exit 77; }
exec timeout 80 "$1" --self-test --quick
