#!/usr/bin/env bash
# Compression benchmark driver: builds tools/bench/compress_bench, times torch.topk (Debian's
# python3-torch, installed with apt-get if missing) and runs the C benchmark with those times,
# so one run prints every operator's encode/decode GB/s, memcpy bandwidth and the top-1% ratio.
#
#   tools/bench/compress.sh [compress_bench options: --level N --samples N --only SPEC]
#   BUILD=dir selects the build directory (default: build, configured if missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build}
[[ -f $build/build.ninja ]] || meson setup "$build" -Dbuildtype=release
ninja -C "$build" tools/bench/compress_bench >/dev/null

if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    sudo=()
    [[ $(id -u) -ne 0 ]] && sudo=(sudo)
    echo "compress.sh: installing python3-torch"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-torch >/dev/null
fi

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cpus; load: $(cut -d' ' -f1-3 /proc/loadavg)"
torch_args=()
while read -r d topk abstopk; do
    echo "torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') d = $d: topk(|x|, d/100) $topk ms (abs + topk $abstopk ms), 1 thread"
    torch_args+=(--torch "$d:$topk")
done < <(/usr/bin/python3 tools/bench/compress_torch.py)
OPENBLAS_NUM_THREADS=1 "$build/tools/bench/compress_bench" "${torch_args[@]}" "$@"
