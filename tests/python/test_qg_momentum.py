#!/usr/bin/python3
"""hearsay.torch's quasi-global momentum (Gossip(..., optimizer=opt, momentum_kind="qg"), issue
19) on a tiny model. First without a network: the gossip round is played by the test, which
moves the flat parameter vector by a known vector between optimizer steps. Checks, against the
rule of Lin et al. 2021 written out here in float64:
  - after a round, torch's momentum buffer is beta mhat + (1 - beta) (x_start - x_end) / lr;
  - a later step of the same round uses beta mhat + g (not beta m + g), and the round's lrs add;
  - a round at lr 0 leaves the buffer as it was; an lr scheduler made before still works;
  - the same through Gossip.step with two D-PSGD peers in threads of this process, real rounds
    on loopback (HS_TEST_IP), with and without overlap;
  - Gossip's momentum_kind is "local" (torch's own) unless "qg" is asked for, and "qg" is
    refused with a reason where it cannot apply (Adam, momentum 0, dampening, SGP).
Exit 77 when /usr/bin/python3 lacks torch."""
import os
import shutil
import signal
import sys
import tempfile
import threading
import warnings

try:
    import torch
except ImportError:
    print("SKIP: no torch")
    sys.exit(77)

import hearsay.torch
from hearsay._qg import QuasiGlobal

torch.manual_seed(0)
BETA, WD = 0.9, 1e-3


def tiny():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def grads_of(model, xb, yb):
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(xb), yb).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()


def buffer_flat(opt, model):
    return torch.cat([opt.state[p]["momentum_buffer"].reshape(-1)
                      for p in model.parameters()]).double()


def check_scheduler():
    """An lr scheduler made before qg still counts opt.step() and does not warn that it was
    overridden; the round's lr is the one the step used, before the scheduler's step."""
    model = tiny()
    flat = hearsay.torch.flatten_parameters(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=BETA)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    qg = QuasiGlobal(opt, flat, list(model.parameters()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x_start = flat.detach().double().clone()
        grads_of(model, torch.randn(8, 4), torch.randint(0, 2, (8,)))
        opt.step()
        sched.step()
        qg.round_end()
    assert opt.param_groups[0]["lr"] == 0.05, opt.param_groups[0]["lr"]
    want = (1 - BETA) * (x_start - flat.detach().double()) / 0.1
    err = (buffer_flat(opt, model) - want).abs().max().item()
    assert err < 1e-6, f"with a scheduler: buffer off the rule by {err}"


def gossip_peer(rank, opts, out, overlap):
    """One of two peers in threads: D-PSGD with qg through Gossip.step; records, per round, how
    far the buffer is from beta mhat + (1 - beta) (x_start - x_after_round) / lr."""
    try:
        model = tiny()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=BETA)
        g = hearsay.torch.Gossip(model, rank=rank, optimizer=opt, momentum_kind="qg",
                                 overlap=overlap, **opts)
        gen = torch.Generator().manual_seed(rank)
        mhat = torch.zeros(g.flat.numel(), dtype=torch.float64)
        errs, moved = [], 0.0
        with g:
            g.start()
            while g.running:
                xb, yb = torch.randn(8, 4, generator=gen), torch.randint(0, 2, (8,), generator=gen)
                x_start = g.flat.detach().double().clone()
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
                x_local = g.flat.detach().double().clone()
                going = g.step()
                x_end = g.flat.detach().double().clone()
                moved = max(moved, (x_end - x_local).abs().max().item())
                mhat = BETA * mhat + (1 - BETA) * (x_start - x_end) / 0.1
                errs.append((buffer_flat(opt, model) - mhat).abs().max().item())
                if not going:
                    break
            if going:
                g.step()  # overlap: the job's last round, collected (False)
            # After the job's last round opt goes on as torch's SGD: its heavy ball from the
            # buffer the last round left (a later step of the same "round" reset it to that
            # buffer, so the momentum stood still at beta mhat + g).
            buf = buffer_flat(opt, model)
            for _ in range(2):
                xb, yb = torch.randn(8, 4, generator=gen), torch.randint(0, 2, (8,), generator=gen)
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(xb), yb).backward()
                gr = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()
                opt.step()
                buf = BETA * buf + gr
            after = (buffer_flat(opt, model) - buf).abs().max().item()
        out[rank] = (errs, moved, after)
    except Exception as e:  # reported by the main thread
        out[rank] = e


def check_gossip(overlap):
    signal.alarm(60)  # the test's own deadline: the nodes are threads of this process
    tmp = tempfile.mkdtemp(prefix="hs-qg-")
    out = {}
    try:
        opts = dict(world=2, insecure=True, listen=f"{os.environ.get('HS_TEST_IP', '127.0.0.1')}:0",
                    quiet=True, algo="dpsgd", compress="none", rounds=5,
                    rendezvous=os.path.join(tmp, "rdv"))
        ts = [threading.Thread(target=gossip_peer, args=(r, opts, out, overlap), daemon=True)
              for r in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(50)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    signal.alarm(0)
    for r in range(2):
        assert r in out, f"peer {r} did not finish"
        if isinstance(out[r], Exception):
            raise out[r]
        errs, moved, after = out[r]
        assert after < 1e-5, \
            f"peer {r} (overlap {overlap}): after the job, heavy ball off by {after}"
        assert len(errs) >= 5, f"peer {r}: {len(errs)} rounds"
        # The gossip moved the parameters (else the rule would not tell qg from local).
        assert moved > 1e-3, f"peer {r}: the rounds moved x by {moved} only"
        assert max(errs) < 1e-4, f"peer {r} (overlap {overlap}): buffer off the rule by {errs}"


def main():
    check_rule()
    check_kinds()
    check_scheduler()
    check_gossip(overlap=False)
    # With a round in flight its change lands at the next step(): the rule holds from the
    # parameters before the optimizer step to those step() leaves.
    check_gossip(overlap=True)
    print("ok: quasi-global momentum in hearsay.torch")


def check_rule():
    model = tiny()
    params = list(model.parameters())
    flat = hearsay.torch.flatten_parameters(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=BETA, weight_decay=WD)
    qg = QuasiGlobal(opt, flat, params)
    data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(8)]
    mhat = torch.zeros(flat.numel(), dtype=torch.float64)
    k = 0
    for steps, lr in ((1, 0.1), (2, 0.05), (1, 0.2), (1, 0.0)):
        for grp in opt.param_groups:
            grp["lr"] = lr
        x_start = flat.detach().double().clone()
        for _ in range(steps):
            xb, yb = data[k]
            k += 1
            x_before = flat.detach().double().clone()
            g = grads_of(model, xb, yb) + WD * x_before
            opt.step()
            x_expect = x_before - lr * (BETA * mhat + g)
            err = (flat.detach().double() - x_expect).abs().max().item()
            assert err < 1e-6, f"step {k}: x is off x - lr (beta mhat + g) by {err}"
        with torch.no_grad():
            flat.add_(0.01 * torch.randn(flat.numel()))  # the gossip's move
        x_end = flat.detach().double().clone()
        qg.round_end()
        if lr > 0:
            mhat = BETA * mhat + (1 - BETA) * (x_start - x_end) / (steps * lr)
        err = (buffer_flat(opt, model) - mhat).abs().max().item()
        scale = mhat.abs().max().item()
        assert scale > 0 and err < 1e-5 * max(1.0, scale), \
            f"round of {steps} steps at lr {lr}: buffer off the displacement rule by {err}"


def check_kinds():
    def kind(make_opt=None, **kw):
        model = tiny()
        opt = make_opt(model) if make_opt else torch.optim.SGD(
            model.parameters(), lr=0.1, momentum=0.9)
        g = hearsay.torch.Gossip(model, optimizer=opt, world=2, rank=0,
                                 rendezvous="/nonexistent/rv", insecure=True, **kw)
        try:
            return g.momentum_kind
        finally:
            g.close()

    assert kind() == "local", "the default changed: torch's own momentum"
    assert kind(momentum_kind="qg") == "qg"
    assert kind(momentum_kind="qg", algo="dpsgd") == "qg"
    refused = (
        ((lambda m: torch.optim.Adam(m.parameters())), {}, "Adam"),
        ((lambda m: torch.optim.SGD(m.parameters(), lr=0.1)), {}, "momentum 0"),
        ((lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, dampening=0.1)), {},
         "dampening"),
        (None, {"algo": "sgp"}, "sgp"),
    )
    for make_opt, kw, what in refused:
        try:
            kind(make_opt, momentum_kind="qg", **kw)
        except ValueError as e:
            assert "qg" in str(e), e
        else:
            raise AssertionError(f"momentum_kind='qg' accepted with {what}")
    model = tiny()
    g = hearsay.torch.Gossip(model, world=2, rank=0, rendezvous="/nonexistent/rv", insecure=True)
    try:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        g.attach(opt, momentum_kind="qg")
        assert g.momentum_kind == "qg", g.momentum_kind
        try:
            g.attach(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), "qg")
        except ValueError as e:
            assert "another optimizer" in str(e), e
        else:
            raise AssertionError("qg attached to a second optimizer")
    finally:
        g.close()
    try:
        kind(momentum_kind="quasi")
    except ValueError as e:
        assert "'local' or 'qg'" in str(e), e
    else:
        raise AssertionError("momentum_kind='quasi' accepted")


if __name__ == "__main__":
    main()
