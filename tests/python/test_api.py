#!/usr/bin/python3
"""The Python package in one process: options and their errors (the C message reaches the
exception), the zero-copy checks (wrong buffers are TypeErrors, never copies), a one-peer job
(start, step until the last round, metrics, request_stop), the context manager, and
hearsay.torch's flat buffer (parameters are views of it; training and gossip write through).
Exit 77 when /usr/bin/python3 lacks NumPy. Env: HEARSAY_LIB, HS_TEST_IP (a loopback address)."""
import os
import subprocess
import sys
import traceback

try:
    import numpy as np
except ImportError:
    print("SKIP: no numpy")
    sys.exit(77)

import hearsay
from hearsay.errors import EINTR

IP = os.environ.get("HS_TEST_IP", "127.0.0.1")
failures = []


def case(fn):
    try:
        fn()
        print(f"ok: {fn.__name__}")
    except Exception:
        failures.append(fn.__name__)
        print(f"FAIL: {fn.__name__}")
        traceback.print_exc()
    return fn


def raises(exc, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except exc as e:
        return e
    raise AssertionError(f"{fn.__name__} did not raise {exc.__name__}")


def solo(**kw):
    """A one-peer job on this test's loopback address."""
    opts = dict(world=1, insecure=True, listen=f"{IP}:0", quiet=True)
    opts.update(kw)
    return hearsay.Node(**opts)


@case
def library_is_the_one_asked_for():
    want = os.environ.get("HEARSAY_LIB")
    assert not want or hearsay.library_path() == want, hearsay.library_path()


@case
def bad_option_value_carries_the_c_message():
    e = raises(hearsay.InvalidArgument, hearsay.Node, algo="nonsense")
    assert isinstance(e, ValueError) and isinstance(e, hearsay.Error)
    assert e.name == "HS_EINVAL" and e.code < 0, (e.name, e.code)
    # The C library's sentence, naming the option or the value, is the exception's text.
    assert "nonsense" in str(e) or "algo" in str(e), str(e)
    assert e.message and e.message in str(e)


@case
def unknown_option_and_underscore_names():
    # An unknown keyword is Python's TypeError (the signature lists the options); by name in
    # `options`, or through Gossip, it is InvalidArgument naming every option as Python spells it.
    raises(TypeError, hearsay.Node, no_such_option=1)
    e = raises(hearsay.InvalidArgument, hearsay.Node, {"no-such-option": 1})
    assert "no-such-option" in str(e) and "gamma_c, " in str(e) and "same_start" in str(e), str(e)
    e = raises(hearsay.InvalidArgument, hearsay.Node, {"lr": 0.1})
    assert "training option" in str(e), str(e)
    # A bad value: the C sentence, and the option as the caller wrote it.
    e = raises(hearsay.InvalidArgument, hearsay.Node, gamma_c=7.0)
    assert "hearsay.Node(gamma_c=7.0)" in str(e) and "gamma-c" in e.message, str(e)
    with hearsay.Node(gamma_c=0.25, compress="topk:0.01", algo="choco") as n:
        assert n.d is None and n.round == 0 and n.metrics() is None


@case
def wrong_buffers_are_type_errors():
    with solo(rounds=2) as n:
        for bad in (np.zeros(8), np.zeros((8, 2), np.float32)[:, 0], [0.0] * 8, b"\0" * 32):
            raises(TypeError, n.start, bad)
        ro = np.zeros(8, np.float32)
        ro.flags.writeable = False
        raises(TypeError, n.start, ro)
        raises(RuntimeError, n.step, np.zeros(8, np.float32))


@case
def one_peer_job_runs_to_its_last_round():
    x = np.linspace(-1, 1, 1000, dtype=np.float32).reshape(10, 100)  # any shape, contiguous
    with solo(rounds=3, algo="dpsgd") as n:
        assert n.start(x) is x
        raises(ValueError, n.step, np.zeros(999, np.float32))
        got = []
        for r in range(3):
            x *= np.float32(0.5)
            n.report(loss=1.0 / (r + 1))
            got.append(n.step(x))
        assert got == [True, True, False], got
        assert n.round == 3 and not n.running, n.round
        m = n.metrics()
        assert isinstance(m, dict) and m, m
    # One peer alone: the gossip leaves the local updates as they were.
    assert np.array_equal(x, np.linspace(-1, 1, 1000, dtype=np.float32).reshape(10, 100) / 8)


@case
def outer_step_through_the_node():
    # outer_lr / outer_momentum are the node options --outer-lr / --outer-momentum: one peer
    # alone, whose gossip leaves its local update, takes the outer Nesterov step of
    # src/train/outer.c on it (computed here in float64).
    e = raises(hearsay.InvalidArgument, hearsay.Node, outer_momentum=1)
    assert "outer-momentum" in str(e), str(e)
    # Either given alone, the other makes them sum to 1 (outer.c's defaults): 0.5 and 0.5 here.
    for given in ({"outer_lr": 0.5, "outer_momentum": 0.5}, {"outer_lr": 0.5},
                  {"outer_momentum": 0.5}):
        x = np.linspace(-1, 1, 64, dtype=np.float32)
        ref, u = x.astype(np.float64), np.zeros(64)
        with solo(rounds=3, algo="dpsgd", **given) as n:
            n.start(x)
            for r in range(3):
                x *= np.float32(0.5)
                n.step(x)
                g = ref - ref * 0.5
                u = 0.5 * u + g
                ref = ref - 0.5 * (g + 0.5 * u)
        assert np.allclose(x, ref, rtol=1e-5, atol=1e-7), (given, x[:4], ref[:4])
    # A vector that is no longer finite makes the outer momentum so: the node stops the run as
    # a divergence, naming the outer momentum.
    x = np.ones(64, np.float32)
    with solo(rounds=3, algo="dpsgd", outer_lr=0.7, outer_momentum=0.9) as n:
        n.start(x)
        x[5] = np.inf
        e = raises(hearsay.Diverged, n.step, x)
        assert "outer momentum is not finite (parameter 5" in str(e), str(e)


@case
def request_stop_raises_interrupted():
    x = np.zeros(100, np.float32)
    with solo(rounds=100) as n:
        n.start(x)
        assert n.step(x)
        n.request_stop()
        e = raises(hearsay.Interrupted, n.step, x)
        assert e.code == EINTR and e.name == "HS_EINTR", (e.code, e.name)


@case
def id_and_rank_after_start():
    x = np.zeros(10, np.float32)
    # world 3 with rank 2 alone (wait_peers 1): the rank is the one asked for, not id mod world.
    with solo(world=3, rank=2, wait_peers=1, rounds=1) as n:
        assert n.id is None and n.rank is None, (n.id, n.rank)
        n.start(x)
        assert n.id == 0 and n.rank == 2, (n.id, n.rank)
        assert not n.step(x)
        assert n.metrics()["peer"] == n.id, n.metrics()
    with solo(rounds=1) as n:
        n.start(x)
        assert n.id == 0 and n.rank == 0, (n.id, n.rank)


def info_lines(quiet):
    """The info lines a one-peer job logs, in a process of its own (the log level is the
    process's), with HEARSAY_LOG unset."""
    code = ("import sys, numpy as np, hearsay\n"
            "with hearsay.Node(world=1, insecure=True, listen=sys.argv[1] + ':0', rounds=2,\n"
            "                  quiet=sys.argv[2] == '1') as n:\n"
            "    x = np.zeros(10, np.float32); n.start(x)\n"
            "    while n.step(x): pass\n")
    env = {k: v for k, v in os.environ.items() if k != "HEARSAY_LOG"}
    r = subprocess.run([sys.executable, "-c", code, IP, "1" if quiet else "0"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [line for line in r.stderr.splitlines() if " info: " in line]


@case
def quiet_drops_info_lines():
    loud = info_lines(False)
    assert loud, "a node that is not quiet logged no info line"
    assert info_lines(True) == [], info_lines(True)


@case
def torch_parameters_become_views_of_one_buffer():
    try:
        import torch
    except ImportError:
        print("skip: no torch")
        return
    import hearsay.torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = hearsay.torch.Gossip(model, world=1, insecure=True, listen=f"{IP}:0", rounds=2,
                             quiet=True)
    with g:
        flat = g.flat
        assert flat.is_contiguous() and flat.numel() == sum(p.numel() for p in params)
        base, off = flat.data_ptr(), 0
        for p, b in zip(model.parameters(), before):
            assert p.data_ptr() == base + 4 * off, "parameter is not a view of the buffer"
            assert torch.equal(p.detach(), b)
            off += p.numel()
        assert [id(p) for p in model.parameters()] == [id(p) for p in params]
        g.start()
        model(torch.randn(7, 5)).pow(2).sum().backward()
        opt.step()
        assert not torch.equal(flat[:20].view(4, 5), before[0])  # the step wrote the buffer
        assert g.step() and not g.step() and g.steps == 2
    # attach: every optimizer step gossips while the job runs, and only then.
    g = hearsay.torch.Gossip(model, world=1, insecure=True, listen=f"{IP}:0", rounds=2,
                             quiet=True)
    with g:
        g.attach(opt)
        g.start()
        for _ in range(3):
            opt.step()
        assert g.steps == 2 and not g.running, g.steps
    # Gossip.state_dict through torch.save: a new Gossip on a fresh model continues from it.
    import io
    g = hearsay.torch.Gossip(model, world=1, insecure=True, listen=f"{IP}:0", rounds=5,
                             quiet=True)
    with g:
        raises(RuntimeError, g.state_dict)
        g.start()
        for _ in range(2):
            opt.step()
            g.step()
        buf = io.BytesIO()
        torch.save({"gossip": g.state_dict()}, buf)
        want, at = g.flat.clone(), g.node.round
    sd = torch.load(io.BytesIO(buf.getvalue()))["gossip"]
    other = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    g = hearsay.torch.Gossip(other, world=1, insecure=True, listen=f"{IP}:0", rounds=5,
                             quiet=True)
    with g:
        g.load_state_dict(sd)
        g.start()
        assert torch.equal(g.flat, want) and g.node.round == at and g.steps == 2, g.node.round
        n = 0
        while g.step():
            n += 1
        assert g.node.round == at + 3, (g.node.round, at)
    raises(ValueError, hearsay.torch.Gossip(other, world=1).load_state_dict, {"x": 1})
    # BatchNorm's running statistics would stay each peer's own: refused, GroupNorm named.
    bn = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4))
    e = raises(ValueError, hearsay.torch.Gossip, bn, world=1, insecure=True)
    assert "GroupNorm" in str(e) and "1" in str(e) and "BatchNorm2d" in str(e), str(e)
    hearsay.torch.Gossip(bn, allow_local_buffers=True, world=1, insecure=True).close()
    hearsay.torch.Gossip(torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.GroupNorm(2, 4)),
                         world=1, insecure=True).close()
    raises(TypeError, hearsay.torch.flatten_parameters, torch.nn.Linear(2, 2).double())
    raises(TypeError, hearsay.Node(world=1).start, torch.zeros(4, dtype=torch.float64))
    raises(TypeError, hearsay.Node(world=1).start, torch.zeros(4, 2)[:, 0])


@case
def launcher_environments():
    from hearsay._env import options
    tr = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.9", "MASTER_PORT": "2950",
          "TORCHELASTIC_RUN_ID": "r1"}
    o = options({}, tr)
    assert o == {"rank": "1", "world": "4", "run-id": "hearsay-r1",
                 "bootstrap": "127.0.0.9:2950", "listen": "127.0.0.9:0"}, o
    o = options({}, dict(tr, RANK="0"))
    assert o["listen"] == "127.0.0.9:2950" and "bootstrap" not in o, o
    # torchrun's static rendezvous keeps its store on MASTER_PORT: the next port is hearsay's.
    o = options({}, dict(tr, RANK="0", TORCHELASTIC_USE_AGENT_STORE="True"))
    assert o["listen"] == "127.0.0.9:2951", o
    # hearsay launch -- COMMAND: its rendezvous file wins over MASTER_ADDR (rank-ordered joins).
    o = options({}, dict(tr, HEARSAY_RENDEZVOUS="/run/rv.addr", HEARSAY_LISTEN="127.0.0.9:0"))
    assert o["rendezvous"] == "/run/rv.addr" and "bootstrap" not in o, o
    assert o["listen"] == "127.0.0.9:0", o
    # mpirun inside a Slurm allocation: Open MPI's rank, not the batch step's SLURM_PROCID.
    o = options({}, {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "5",
                     "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "OMPI_MCA_ess_base_jobid": "7"})
    assert o["rank"] == "3" and o["world"] == "5" and o["rendezvous"] == "hearsay-7.addr", o
    o = options({}, {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "9",
                     "SLURM_STEP_ID": "0", "HEARSAY_SECRET_FILE": "/k"})
    assert o["rendezvous"] == "hearsay-9.0.addr" and o["secret-file"] == "/k", o
    # The caller's placement wins whole; its other options too.
    assert options({"world": 2}, tr) == {}, options({"world": 2}, tr)
    o = options({"listen": "127.0.0.2:0", "run-id": "mine", "insecure": True}, tr)
    assert "listen" not in o and "run-id" not in o and "secret-file" not in o, o
    assert options({}, {}) == {}
    raises(ValueError, options, {}, dict(tr, RANK="4"))
    raises(ValueError, options, {}, dict(tr, WORLD_SIZE="x"))


@case
def signature_matches_c_option_table():
    """Node's keyword arguments are the C table's options (hs_node_option_name), with the same
    defaults: neither can change without the other."""
    import ctypes
    import inspect
    f = hearsay._lib.lib().hs_node_option_name
    f.restype, f.argtypes = ctypes.c_char_p, [ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p)]
    table, i = {}, 0
    while True:
        d = ctypes.c_char_p()
        name = f(i, ctypes.byref(d))
        if not name:
            break
        table[name.decode().replace("-", "_")] = None if d.value is None else d.value.decode()
        i += 1
    params = {p.name: p for p in inspect.signature(hearsay.Node.__init__).parameters.values()
              if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(params) == set(table), (set(params) ^ set(table))
    assert hearsay.node.option_names() == tuple(params)
    for name, c_default in table.items():
        p = params[name]
        assert p.annotation is not inspect.Parameter.empty, name
        if c_default is None:
            assert p.default is None, (name, p.default)
        else:
            assert hearsay.node.option_value(p.default) == c_default, (name, p.default, c_default)
    # Documented in the class docstring too.
    for name in table:
        assert name in hearsay.Node.__doc__, name


LOG_CHILD = """
import logging, sys, threading, numpy as np, hearsay
records = []
class Keep(logging.Handler):
    def emit(self, r):
        records.append(r)
logging.getLogger("hearsay").addHandler(Keep())
logging.getLogger("hearsay").setLevel(logging.INFO)
def peer(rank):
    x = np.full(10, float(rank), np.float32)
    with hearsay.Node(world=2, rank=rank, insecure=True, listen=sys.argv[1] + ":0", rounds=3,
                      rendezvous=sys.argv[2], run_id="logtest", on_divergence="warn") as n:
        n.start(x)
        going = True
        while going:
            n.report(accuracy=0.5)  # an info line of the round, from this thread
            going = n.step(x)
threads = [threading.Thread(target=peer, args=(r,), name=f"r{r}") for r in (0, 1)]
for t in threads: t.start()
for t in threads: t.join()
rounds = [r for r in records if r.getMessage().startswith("round ")]
assert rounds, [r.getMessage() for r in records]
for r in rounds:
    assert r.levelno == logging.INFO and r.name == "hearsay", r
    assert r.rank == int(r.threadName[1]), (r.rank, r.threadName, r.getMessage())
assert {r.rank for r in rounds} == {0, 1}, {r.rank for r in rounds}
warns = [r for r in records if "--insecure" in r.getMessage()]
assert warns and all(r.levelno == logging.WARNING for r in warns), warns
assert all(hasattr(r, "rank") and hasattr(r, "peer") for r in records)
print("records", len(records), "round records", len(rounds))
"""


@case
def log_records_reach_python_logging_with_the_rank():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        env = {k: v for k, v in os.environ.items() if k != "HEARSAY_LOG"}
        r = subprocess.run([sys.executable, "-c", LOG_CHILD, IP, os.path.join(d, "rv")], env=env,
                           capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    # A configured "hearsay" logger takes every line: nothing of the library's on stderr.
    assert " info: " not in r.stderr and " warn: " not in r.stderr, r.stderr


class FakeNode:
    """A node whose round is a fixed map of the vector (host = 0.5 host + 1) and whose job ends
    after `rounds` rounds: the overlap's bookkeeping against a reference, with no network."""

    def __init__(self, rounds):
        self.rounds, self.done, self.running, self.reports = rounds, 0, True, []

    def report(self, loss=float("nan"), accuracy=float("nan")):
        self.reports.append(loss)

    def step(self, host):
        host.mul_(0.5).add_(1.0)
        self.done += 1
        self.running = self.done < self.rounds
        return self.running

    def close(self):
        pass


@case
def overlap_applies_each_round_one_step_late():
    """Gossip(overlap=True) on CPU tensors: step k hands its parameters to the round, step k+1
    adds the round's change (result - sent); the job's end, close() and report() follow."""
    try:
        import torch
    except ImportError:
        print("skip: no torch")
        return
    import hearsay.torch

    def run(rounds, steps):
        torch.manual_seed(3)
        model = torch.nn.Linear(6, 5)
        node = FakeNode(rounds)
        g = hearsay.torch.Gossip(model, node=node, overlap=True)
        got = []
        with g:
            for k in range(steps):
                with torch.no_grad():
                    g.flat.mul_(0.9)  # the local update
                g.report(loss=float(k))
                going = g.step()
                got.append(going)
                if not going:
                    break
        return g.flat.clone(), got, node
    def reference(rounds, steps):
        torch.manual_seed(3)
        theta = torch.cat([p.detach().reshape(-1) for p in torch.nn.Linear(6, 5).parameters()])
        sent, done, got = None, 0, []
        for k in range(steps):
            theta.mul_(0.9)
            going = True
            if sent is not None:
                mixed = sent.clone().mul_(0.5).add_(1.0)
                done += 1
                going = done < rounds
                theta.add_(mixed - sent)
                sent = None
            got.append(going)
            if not going:
                break
            sent = theta.clone()
        if sent is not None:  # close() applies the round in flight
            theta.add_(sent.clone().mul_(0.5).add_(1.0) - sent)
        return theta, got
    for rounds, steps in ((4, 10), (10, 4), (1, 3)):
        flat, got, node = run(rounds, steps)
        want, want_got = reference(rounds, steps)
        assert got == want_got, (rounds, steps, got, want_got)
        assert torch.equal(flat, want), (rounds, steps, (flat - want).abs().max())
        # Each round reported the loss of the step that handed it over.
        assert node.reports == [float(k) for k in range(node.done)], node.reports


@case
def overlap_two_peers_reach_the_average():
    """Two CPU models on two threads, D-PSGD through real nodes with overlap=True: with no
    local update the delayed gossip is the synchronous one, so both end at the average."""
    try:
        import torch
    except ImportError:
        print("skip: no torch")
        return
    import tempfile
    import threading
    import hearsay.torch

    out, errs = {}, []

    def peer(rank, rv):
        try:
            model = torch.nn.Linear(4, 3)
            with torch.no_grad():
                for p in model.parameters():
                    p.fill_(float(rank))
            g = hearsay.torch.Gossip(model, overlap=True, algo="dpsgd", world=2, rank=rank,
                                     rendezvous=rv, insecure=True, listen=f"{IP}:0", rounds=6,
                                     same_start=False, on_divergence="warn", quiet=True,
                                     run_id="overlap")
            with g:
                g.start()
                n = 0
                while g.step():
                    n += 1
                out[rank] = (g.flat.clone(), n, g.node.round)
        except Exception as e:  # reported by the main thread
            errs.append(e)

    with tempfile.TemporaryDirectory() as d:
        ts = [threading.Thread(target=peer, args=(r, os.path.join(d, "rv"))) for r in (0, 1)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
    assert not errs, errs
    for r in (0, 1):
        flat, n, rnd = out[r]
        assert n == 6 and torch.allclose(flat, torch.full_like(flat, 0.5)), (r, n, flat)


sys.exit(1 if failures else 0)
