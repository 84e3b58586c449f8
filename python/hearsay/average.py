"""hearsay.average: every peer ends with the average of all the peers' vectors, in a few rounds.

Gossip leaves each peer with its own model near, not at, the peers' mean, and after few epochs
under compression that spread costs accuracy (docs/RESULTS.md, "Accuracy at equal steps"). The
exact mean is cheap to reach once, at the end: a short job of D-PSGD rounds with no local update
over a schedule that averages in finitely many rounds. For n a power of 2 it is dimension
exchange: in round k every peer i averages with peer i XOR 2^k (weights 1/2), so after log2(n)
rounds each holds the mean of all n vectors (recursive doubling); each round sends one vector
per peer, log2(n) vectors in all. For other n it is one round of the complete graph (weights
1/n): exact too, at n - 1 vectors per peer. The vectors travel through `compress` (default
fp16: the mean to within fp16's rounding, about 5e-4 of each value, at half the bytes; "none"
for the mean to float32 rounding).

The averaging job reuses the round engine (hearsay.Node, algo dpsgd, a topology file with that
schedule) and the main job's placement and security: the same world, rank, secret or
certificates, a rendezvous file PATH.average with run id RUN-average, or, for a job that met
through bootstrap addresses, the port above each given port (listen, advertise and bootstrap:
port P + 1 must be free on every host) with run id RUN-average. It waits up to 120 s for the
last peer to arrive unless the job gave a join-timeout. Its own options win over those
(`options`). Every peer of the job must call it, once its last round is
over."""
import json
import os
import shutil
import tempfile
import time
from typing import Any, Dict, Mapping, Optional

from .node import Node, OptionValue, _option_name

# Options of the main job that the averaging job keeps as they are: who the peer is, how it
# proves it, how the runtime waits. Placement (listen, bootstrap, rendezvous, run id) is
# derived below; the algorithm, topology, rounds, metrics and checkpoints are the average's own.
_KEPT = ("world", "rank", "seed", "quiet", "insecure", "secret-file", "ca", "cert", "key",
         "emulate", "max-frame", "peer-timeout", "join-timeout", "handshake-timeout",
         "recv-timeout", "max-pending", "max-pending-per-addr")
_JOIN_WAIT_MS = 120000  # the averaging job's join timeout when the main job gave none


def schedule(n: int) -> Dict[str, Any]:
    """The topology (hearsay's JSON file format, docs/TOPOLOGY.md) whose rounds, run once each
    in order, make every one of n >= 2 peers hold the mean: dimension exchange for a power of
    2 (log2(n) rounds), else the complete graph with weights 1/n (one round)."""
    if n < 2:
        raise ValueError(f"hearsay.average: schedule for {n} peers: needs at least 2")
    if n & (n - 1) == 0:
        rounds = [{"edges": [[i, i ^ (1 << k), 0.5] for i in range(n) if i < i ^ (1 << k)]}
                  for k in range(n.bit_length() - 1)]
        return {"name": f"dimension-exchange-{n}", "peers": n, "schedule": rounds}
    return {"name": f"complete-average-{n}", "peers": n,
            "edges": [[i, j, 1.0 / n] for i in range(n) for j in range(i + 1, n)]}


def rounds_needed(n: int) -> int:
    """Rounds of schedule(n): log2(n) for a power of 2, else 1 (0 for one peer)."""
    if n < 2:
        return 0
    return n.bit_length() - 1 if n & (n - 1) == 0 else 1


def _port_above(addr: str) -> str:
    """HOST:PORT with the port one higher (0 stays 0: the system picks)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"hearsay.average: address {addr!r} is not HOST:PORT")
    p = int(port)
    if p >= 65535:
        raise ValueError(f"hearsay.average: address {addr!r}: no port above {p}")
    return f"{host}:{p + 1 if p else 0}"


def job_options(given: Mapping[str, OptionValue], compress: str = "fp16",
                options: Optional[Mapping[str, OptionValue]] = None) -> Dict[str, OptionValue]:
    """The averaging job's node options (C names) from the main job's (`given`, as
    hearsay.Node took them, launcher's included) and the caller's `options`, which win.
    ValueError when the main job has neither a rendezvous nor listen/bootstrap addresses to
    derive a meeting place from and `options` gives none."""
    g = {_option_name(k): v for k, v in given.items()}
    own = {_option_name(k): v for k, v in (options or {}).items()}
    world = int(str(own.get("world", g.get("world", 1))))
    out: Dict[str, OptionValue] = {k: g[k] for k in _KEPT if k in g}
    if "rendezvous" in g:
        rv = g["rendezvous"]
        out["rendezvous"] = (os.fspath(rv) if isinstance(rv, os.PathLike) else str(rv)) + \
            ".average"
        out["run-id"] = str(g.get("run-id", "hearsay")) + "-average"
        for k in ("listen", "advertise"):
            if k in g:
                out[k] = _port_above(str(g[k]))
    elif "listen" in g or "bootstrap" in g:
        for k in ("listen", "advertise", "bootstrap"):
            if k in g:
                out[k] = _port_above(str(g[k]))
        # Always a run id of its own: a port above may be another peer's listener of the main
        # job (consecutive ports on one host), which must refuse the averaging job's handshake
        # rather than take its peers as late joiners of the job that ended.
        out["run-id"] = str(g.get("run-id", "hearsay")) + "-average"
    elif world > 1 and not any(k in own for k in ("rendezvous", "bootstrap", "listen")):
        raise ValueError("hearsay.average: the job has no rendezvous, listen or bootstrap "
                         "option to derive the averaging job's meeting place from: pass one "
                         "in options")
    if "join-timeout" not in g:
        # Peers end the main job apart (a straggler, SGP's uneven progress): the first to
        # finish waits here for the last one, longer than a join's default 30 s.
        out["join-timeout"] = _JOIN_WAIT_MS
    out.update({"algo": "dpsgd", "compress": compress, "rounds": rounds_needed(world),
                "same-start": False, "wait-peers": world,
                # Peers that start apart look diverged to the guard at the first round.
                "on-divergence": "warn"})
    out.update(own)
    return out


def average(x: Any, given: Mapping[str, OptionValue], compress: str = "fp16",
            options: Optional[Mapping[str, OptionValue]] = None,
            linger: Optional[float] = None) -> Dict[str, Any]:
    """Makes x (a float32 NumPy array or contiguous CPU tensor, in place) the mean of the n
    peers' x, n the `world` of `given` (the main job's options, see job_options): every peer
    of the job calls it with its own vector. Returns what it cost: rounds, bytes_sent (this
    peer's payload, as the metrics count it), seconds (joining and lingering included),
    peers. Raises hearsay.Error when the job fails, RuntimeError when a neighbour's vector
    did not come (x then holds a partial mix, not the mean). Only the peer that missed a
    vector raises; its partners' later rounds carry its partial mix on, so after a
    RuntimeError on any peer no peer's x is the mean: treat the whole average as failed (a
    launcher does, by that peer's non-zero exit).

    After its last round a peer waits `linger` seconds before it leaves (default: twice its
    longest round, at least 0.2 s): on the thin-WAN profile of tools/bench/wan (n = 4) a
    peer that finished first and left at once cost its slower partner the last vector. The
    runtime then dropped a leaver's data that came after a member list without it; it keeps
    it now (test net_leave_late), and the linger stays as a margin for what it did not show."""
    opts = job_options(given, compress, options)
    world = int(str(opts.get("world", 1)))
    t0 = time.perf_counter()
    if world < 2:
        return {"rounds": 0, "bytes_sent": 0, "seconds": 0.0, "peers": world}
    tmp = tempfile.mkdtemp(prefix="hearsay-average-")
    try:
        if "topology" not in opts:
            path = os.path.join(tmp, "average.json")
            with open(path, "w") as f:
                json.dump(schedule(world), f)
            opts["topology"] = path
        missing: Dict[int, int] = {}  # round: neighbour messages that did not come
        sent, records = 0, 0
        with Node(opts) as node:
            node.start(x)
            if not node.running:
                raise RuntimeError("hearsay.average: the averaging job had ended before this "
                                   "peer joined it: x is not this job's mean")
            going, longest = True, 0.0
            while going:
                r0 = time.perf_counter()
                going = node.step(x)
                longest = max(longest, time.perf_counter() - r0)
                rec: Optional[Mapping[str, Any]] = node.metrics()
                if rec is not None:
                    if rec.get("missing"):
                        missing[int(rec.get("round", -1))] = int(rec["missing"])
                    sent = int(rec.get("bytes_sent", sent))
                    records += 1
            time.sleep(max(0.2, 2 * longest) if linger is None else linger)
        if missing:
            where = ", ".join(f"{k} in round {r}" for r, k in sorted(missing.items()))
            raise RuntimeError(f"hearsay.average: neighbour messages did not come in time "
                               f"({where}): x is a partial mix, not the mean")
        return {"rounds": records, "bytes_sent": sent,
                "seconds": time.perf_counter() - t0, "peers": world}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

