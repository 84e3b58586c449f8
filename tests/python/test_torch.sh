#!/usr/bin/env bash
# 4 processes train a PyTorch CNN (examples/pytorch/train.py, hearsay.torch) on their shards of
# a Fashion-MNIST subset and gossip it, once with CHOCO top-1% and once with D-PSGD, on a ring
# over TLS. Checks: every peer finishes its rounds and learned something; D-PSGD kept the
# replicas close (spread well under how far they moved); CHOCO top-1% sent under 5% of
# D-PSGD's bytes.
# Usage: test_torch.sh (env: HEARSAY_LIB, HS_SOURCE_ROOT)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
need_python numpy torch
[[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] ||
    { echo "SKIP: no Fashion-MNIST (dataset-fashion-mnist)"; exit 77; }
printf 'torch-test-secret-0123456789abcdef' >"$tmp/secret"
chmod 600 "$tmp/secret"
ex=$HS_SOURCE_ROOT/examples/pytorch
for algo in choco:topk:0.01 dpsgd:none; do
    a=${algo%%:*}
    mkdir -p "$tmp/$a"
    run_peers 4 "$tmp/$a/p" "$py" "$ex/train.py" --rank {R} --world 4 --rendezvous "$tmp/$a/rv" \
        --listen "$ip:0" --secret-file "$tmp/secret" --algo "$a" --compress "${algo#*:}" \
        --subset 4000 --test-subset 500 --epochs 2 --save "$tmp/$a/x{R}"
    cat "$tmp/$a"/p*.log
done
"$py" - "$tmp" <<'PY' || fail "checks failed"
import re, sys
import numpy as np
sys.path.insert(0, __import__("os").environ["HS_SOURCE_ROOT"] + "/examples/pytorch")
import torch, fmnist
tmp = sys.argv[1]
x0 = torch.cat([p.detach().reshape(-1) for p in fmnist.cnn(seed=1).parameters()]).numpy()
sent = {}
for a in ("choco", "dpsgd"):
    logs = [open(f"{tmp}/{a}/p{r}.log").read() for r in range(4)]
    accs = [float(re.search(r"test accuracy ([\d.]+)%", l).group(1)) for l in logs]
    rounds = {int(re.search(r"after (\d+) rounds", l).group(1)) for l in logs}
    sent[a] = sum(float(re.search(r"([\d.]+) MB sent", l).group(1)) for l in logs)
    assert rounds == {2 * (1000 // 128)}, rounds  # 2 epochs of a 1000-example shard, batch 128
    assert min(accs) > 30, (a, accs)  # 10 classes: chance is 10%
    x = np.stack([np.fromfile(f"{tmp}/{a}/x{r}", np.float32) for r in range(4)])
    spread = np.linalg.norm(x - x.mean(0), axis=1).mean()
    moved = np.linalg.norm(x.mean(0) - x0)
    print(f"{a}: accuracies {accs}, spread {spread:.4g}, moved {moved:.4g}, {sent[a]:.3f} MB")
    if a == "dpsgd":
        assert spread < 0.2 * moved, (spread, moved)
assert sent["choco"] < 0.05 * sent["dpsgd"], sent
PY
echo "ok: 4 PyTorch peers with CHOCO top-1% and D-PSGD"
