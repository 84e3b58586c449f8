"""hearsay.Node: one networked peer gossiping a vector the caller owns (hs_node_* of node.h).

Zero-copy: the C library reads and writes the caller's float32 buffer in place, so only
C-contiguous, writeable float32 NumPy arrays and contiguous float32 CPU torch tensors are
accepted; anything else is a TypeError, never a silent copy (a copy would leave the caller's
model untouched by the gossip). Threading: one thread at a time per node, except
request_stop, which any thread may call."""
import ctypes
import glob
import inspect
import json
import math
import os
import shutil
import tempfile
import threading
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from . import _env, _lib
from .errors import EINVAL, ERANGE, Error, InvalidArgument

_c_float_p = ctypes.POINTER(ctypes.c_float)
_NO_ID = 0xFFFFFFFF  # HS_NODE_NO_ID: no id before hs_node_start


OptionValue = Union[str, int, float, bool, os.PathLike[str]]
StrPath = Union[str, os.PathLike[str]]


def option_value(v: OptionValue) -> str:
    """The option string of a Python value: flags as "1"/"0", paths as paths, numbers as the
    shortest text that reads back the same."""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    if isinstance(v, float):
        return repr(v)
    return str(v)


def buffer_of(x: Any) -> Tuple[Any, int]:
    """(pointer, number of floats) of a buffer the library may write in place, or TypeError."""
    mod = type(x).__module__ or ""
    if mod.startswith("numpy"):
        import numpy as np

        if not isinstance(x, np.ndarray):
            raise TypeError(f"hearsay: expected a numpy.ndarray, got {type(x).__name__}")
        if x.dtype != np.float32:
            raise TypeError(f"hearsay: the array is {x.dtype}, the gossip works in place on "
                            "float32 only (convert it once with x.astype(np.float32) and keep it)")
        if not x.flags.c_contiguous:
            raise TypeError("hearsay: the array is not C-contiguous; gossip works in place on one "
                            "contiguous buffer (np.ascontiguousarray once, and keep that array)")
        if not x.flags.writeable:
            raise TypeError("hearsay: the array is read-only; the gossip writes it in place")
        if not x.flags.aligned:
            raise TypeError("hearsay: the array's data is not aligned for float32")
        return ctypes.cast(x.ctypes.data, _c_float_p), int(x.size)
    if mod.startswith("torch"):
        import torch

        if not isinstance(x, torch.Tensor):
            raise TypeError(f"hearsay: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype != torch.float32:
            raise TypeError(f"hearsay: the tensor is {x.dtype}, the gossip works in place on "
                            "torch.float32 only")
        if x.device.type != "cpu":
            raise TypeError(f"hearsay: the tensor is on {x.device}; Node.step needs host memory "
                            "(hearsay.torch.Gossip stages CUDA models through pinned memory)")
        if not x.is_contiguous():
            raise TypeError("hearsay: the tensor is not contiguous; gossip works in place on one "
                            "contiguous buffer (hearsay.torch.Gossip flattens a model's parameters)")
        return ctypes.cast(x.data_ptr(), _c_float_p), int(x.numel())
    raise TypeError(f"hearsay: expected a float32 numpy.ndarray or torch.Tensor, got "
                    f"{type(x).__module__}.{type(x).__name__}")


class Node:
    """One peer of a decentralized job, gossiping a float32 vector the caller owns.

    The keyword arguments are the node's options (hs_node_options_set; `hearsay run`'s flags
    without the dashes, with underscores): `gamma_c=0.1` is `--gamma-c 0.1`, `insecure=True`
    is `--insecure`. None (and any argument left at its default) means the library's own
    choice: the algorithm's compressor and topology, CHOCO's automatic step, the launcher's
    rank, world and rendezvous (hearsay._env). `options` takes the same by name ("gamma-c" or
    "gamma_c"); keyword arguments win. Invalid options raise hearsay.InvalidArgument here,
    before anything is opened.

        with hearsay.Node(algo="choco", compress="topk:0.01", rendezvous="job.addr",
                          world=4, rank=r, secret_file="run.key", rounds=1000) as node:
            node.start(x)              # may overwrite x with the job's vector
            while True:
                local_update(x)
                if not node.step(x):   # False after the job's last round
                    break

    Options: algo (dpsgd, dcd, choco, sgp, beer), compress ("topk:0.01", ...), gamma_c
    (CHOCO/BEER step, (0, 1]), topology (ring, torus:RxC, exponential, ... or a .json file),
    staleness (SGP), recv_timeout (ms), seed, rounds (0: no end), metrics (a JSON-lines file,
    "{id}" expanded), quiet (no info lines), on_divergence ("warn" or "stop"), listen,
    advertise and bootstrap ("HOST:PORT"), secret_file, ca/cert/key (certificates), insecure
    (plain TCP), run_id, emulate (link emulation spec), max_frame (bytes), peer_timeout,
    join_timeout and handshake_timeout (ms), max_pending and max_pending_per_addr (strangers
    at the door), world (shards), rank, rendezvous (a file), wait_peers, checkpoint_dir,
    checkpoint_every (rounds), resume, same_start (every peer starts from the same vector),
    outer_lr and outer_momentum (the outer Nesterov step over the gossip; either turns it on,
    the other then makes them sum to 1, as 0.5 and 0.5 do; 1 and 0 is the plain algorithm;
    DiLoCo's 0.7 / 0.9 is for hundreds of local steps and overshoots over a few of SGD with
    momentum: README).
    """

    def __init__(
        self,
        options: Optional[Mapping[str, OptionValue]] = None,
        *,
        algo: Optional[str] = None,
        compress: Optional[str] = None,
        gamma_c: Optional[float] = None,
        topology: Optional[str] = None,
        staleness: Optional[int] = None,
        recv_timeout: Optional[int] = None,
        seed: int = 1,
        rounds: int = 0,
        metrics: Optional[StrPath] = None,
        quiet: bool = False,
        on_divergence: Optional[str] = None,
        listen: Optional[str] = None,
        advertise: Optional[str] = None,
        bootstrap: Optional[str] = None,
        secret_file: Optional[StrPath] = None,
        ca: Optional[StrPath] = None,
        cert: Optional[StrPath] = None,
        key: Optional[StrPath] = None,
        insecure: bool = False,
        run_id: Optional[str] = None,
        emulate: Optional[str] = None,
        max_frame: Optional[int] = None,
        peer_timeout: Optional[int] = None,
        join_timeout: Optional[int] = None,
        handshake_timeout: Optional[int] = None,
        max_pending: Optional[int] = None,
        max_pending_per_addr: Optional[int] = None,
        world: int = 1,
        rank: Optional[int] = None,
        rendezvous: Optional[StrPath] = None,
        wait_peers: Optional[int] = None,
        checkpoint_dir: Optional[StrPath] = None,
        checkpoint_every: int = 100,
        resume: bool = False,
        same_start: bool = True,
        outer_lr: Optional[float] = None,
        outer_momentum: Optional[float] = None,
    ) -> None:
        args = locals()
        self._L = _lib.lib()
        self._opts = ctypes.c_void_p()
        self._h = ctypes.c_void_p()
        self._d: Optional[int] = None
        self._started = False
        self.running = False
        self._resume_dir: Optional[str] = None  # load_state_dict's checkpoint, removed at close
        self._given: Dict[str, OptionValue] = {}
        _lib.check(self._L.hs_node_options_new(ctypes.byref(self._opts)), "hs_node_options_new")
        try:
            merged: Dict[str, OptionValue] = {}
            for name, v in (options or {}).items():
                merged[_option_name(name)] = v
            # Arguments left at their defaults are not given: the library (or the launcher's
            # environment) decides them.
            for py_name, default in _DEFAULTS.items():
                v = args[py_name]
                if v is not None and not (type(v) is type(default) and v == default):
                    merged[py_name.replace("_", "-")] = v
            merged = {k: v for k, v in merged.items() if v is not None}
            # torchrun, srun, mpirun, hearsay launch: rank, world and rendezvous when not given.
            for k, ev in _env.options(merged, os.environ).items():
                merged.setdefault(k, ev)
            self._given = merged
            for name, v in merged.items():
                self._set(name, v)
        except BaseException:
            self.close()
            raise

    def _set(self, name: str, v: OptionValue) -> None:
        rc = self._L.hs_node_options_set(self._opts, name.encode(), option_value(v).encode())
        if rc < 0:
            try:
                _lib.check(rc, "hs_node_options_set")
            except Error as e:
                # The C sentence (e.message) names the option as C does; the text says it as
                # the Python caller wrote it.
                e.args = (f"hearsay.Node({name.replace('-', '_')}={v!r}): {e.message} [{e.name}]",)
                raise

    # ------------------------------------------------------------------ lifecycle
    def start(self, x: Any) -> Any:
        """Starts or joins the job with x (float32, in place) as this peer's starting vector;
        when the peer joins a running job or resumes, x is overwritten with the job's vector.
        Blocks until the job's peers are there; Ctrl-C asks the node to stop and raises
        KeyboardInterrupt. A peer let in after the job's end has no round to run: running is
        False at once and x is the job's final vector."""
        ptr, d = buffer_of(x)
        if self._h:
            raise RuntimeError("hearsay: Node.start called twice")
        if not self._opts:
            raise RuntimeError("hearsay: the node is closed")
        _lib.check(self._L.hs_node_new(ctypes.byref(self._h), self._opts, d), "hs_node_new")
        self._d = d
        rc = self._interruptible(self._L.hs_node_start, ptr, d, "hs_node_start")
        self._started = True
        self.running = rc == 0
        return x

    def step(self, x: Any) -> bool:
        """One gossip round on x (float32, d floats, after the local update), in place. Returns
        True while the job goes on and False after its last round; raises hearsay.Error
        (Diverged, Canceled, Interrupted, ...) with the C message otherwise."""
        ptr, d = buffer_of(x)
        self._check_size(d)
        rc = self._L.hs_node_step(self._h, ptr, d)
        if rc < 0:
            self.running = False
            _lib.check(rc, "hs_node_step")
        self.running = rc == 0
        return self.running

    def _check_size(self, d: int) -> None:
        if not self._started or not self._h:
            raise RuntimeError("hearsay: Node.step needs a started node (Node.start(x) first)")
        if d != self._d:
            raise ValueError(f"hearsay: the vector has {d} floats, the node was started with "
                             f"{self._d}")

    def _interruptible(self, fn: Any, ptr: Any, d: int, what: str) -> int:
        # The call runs on a helper thread so that the main thread stays in Python and receives
        # KeyboardInterrupt; the error text is read on the thread that failed (it is
        # thread-local in C).
        out: Dict[str, Error] = {}
        rc = [0]

        def run() -> None:
            try:
                rc[0] = _lib.check(fn(self._h, ptr, d), what)
            except Error as e:
                out["err"] = e

        t = threading.Thread(target=run, name="hearsay-" + what, daemon=True)
        t.start()
        try:
            while t.is_alive():
                t.join(0.1)
        except KeyboardInterrupt:
            self._L.hs_node_request_stop(self._h, 0)
            t.join()
            raise
        if "err" in out:
            raise out["err"]
        return rc[0]

    def leave(self) -> None:
        """Leaves the job gracefully (BYE); idempotent."""
        self.running = False
        if self._h:
            _lib.check(self._L.hs_node_leave(self._h), "hs_node_leave")

    def close(self) -> None:
        """Leaves and frees the node; the object is unusable afterwards. Idempotent."""
        self.running = self._started = False
        if getattr(self, "_h", None):
            self._L.hs_node_free(self._h)
            self._h = ctypes.c_void_p()
        if getattr(self, "_opts", None):
            self._L.hs_node_options_free(self._opts)
            self._opts = ctypes.c_void_p()
        resume_dir = getattr(self, "_resume_dir", None)
        if resume_dir:
            shutil.rmtree(resume_dir, ignore_errors=True)
            self._resume_dir = None

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        """The node's state now, between two steps, as a dict of plain values (for torch.save
        or pickle): the bytes of a checkpoint file (hs_node_checkpoint: the vector, the local
        step count, the algorithm's state, the job's end round, the members) with its round
        and rank. A node given it with load_state_dict before start continues from it."""
        if not self._started or not self._h:
            raise RuntimeError("hearsay: state_dict needs a started node")
        tmp = tempfile.mkdtemp(prefix="hearsay-state-")
        try:
            _lib.check(self._L.hs_node_checkpoint(self._h, tmp.encode()), "hs_node_checkpoint")
            files = glob.glob(os.path.join(tmp, "ckpt-*.hsck"))
            if len(files) != 1:
                raise RuntimeError(f"hearsay: hs_node_checkpoint wrote {len(files)} files")
            with open(files[0], "rb") as f:
                data = f.read()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return {"format": "hearsay-node-state", "version": 1, "round": self.round,
                "rank": self.rank, "checkpoint": data}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes start() continue from a state_dict() of this peer (the same rank, a vector of
        the same size): start writes the saved vector into x and the job goes on from the
        saved round to the saved end. The whole job restarts this way, every peer from its
        own state; neighbours send each other full replicas at the first round. Before start
        only."""
        if self._h or not self._opts:
            raise RuntimeError("hearsay: load_state_dict must come before start")
        if not isinstance(state, dict) or state.get("format") != "hearsay-node-state":
            raise ValueError("hearsay: not a hearsay Node.state_dict()")
        if state.get("version") != 1:
            raise ValueError(f"hearsay: node state version {state.get('version')}; this "
                             "package reads version 1")
        rank, rnd, data = int(state["rank"]), int(state["round"]), state["checkpoint"]
        if self._resume_dir:
            shutil.rmtree(self._resume_dir, ignore_errors=True)
        self._resume_dir = tempfile.mkdtemp(prefix="hearsay-resume-")
        # The name the C library looks for (hearsay/checkpoint.h); it validates the bytes.
        with open(os.path.join(self._resume_dir, f"ckpt-{rank}-{rnd:012d}.hsck"), "wb") as f:
            f.write(bytes(data))
        opts = [("checkpoint-dir", self._resume_dir), ("resume", "1"), ("rank", str(rank))]
        # The whole job restarts: each peer waits for all before going on (a resumed peer
        # otherwise goes on alone once no member of the old job answers).
        if "wait-peers" not in self._given and int(str(self._given.get("world", 1))) > 1:
            opts.append(("wait-peers", str(self._given["world"])))
        for name, v in opts:
            _lib.check(self._L.hs_node_options_set(self._opts, name.encode(), v.encode()),
                       "hs_node_options_set")

    def __enter__(self) -> "Node":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ queries
    @property
    def d(self) -> Optional[int]:
        """Floats per vector (None before start)."""
        return self._d

    @property
    def round(self) -> int:
        """The next round this node will run."""
        return int(self._L.hs_node_round(self._h)) if self._h else 0

    @property
    def id(self) -> Optional[int]:
        """This peer's id in the job (the metrics' "peer", the log's "peer N"); None before start.
        A peer removed from the job and let in again has a new one."""
        v = int(self._L.hs_node_id(self._h)) if self._h else _NO_ID
        return None if v == _NO_ID else v

    @property
    def rank(self) -> Optional[int]:
        """The shard this peer stands for (the rank option, the checkpoint's, or id mod world);
        None before start."""
        v = int(self._L.hs_node_rank(self._h)) if self._h else -1
        return None if v < 0 else v

    def report(self, loss: float = math.nan, accuracy: float = math.nan) -> None:
        """This round's training loss and test accuracy, for the metrics and the guard."""
        if self._h:
            self._L.hs_node_report(self._h, float(loss), float(accuracy))

    def metrics(self) -> Optional[Dict[str, Any]]:
        """The last round's metrics record (docs/METRICS.md) as a dict; None before round 1."""
        if not self._h:
            return None
        cap = 4096
        while True:
            buf = ctypes.create_string_buffer(cap)
            rc = self._L.hs_node_metrics_json(self._h, buf, cap)
            if rc >= 0:
                rec: Dict[str, Any] = json.loads(buf.value.decode("utf-8"))
                return rec
            if rc == ERANGE and cap < (1 << 24):  # grow and ask again
                cap *= 4
                continue
            if rc == EINVAL:  # no round yet
                return None
            _lib.check(rc, "hs_node_metrics_json")

    def request_stop(self, checkpoint: bool = False) -> None:
        """Asks the node to stop after the current round (step then raises Interrupted). Any
        thread may call it."""
        if self._h:
            self._L.hs_node_request_stop(self._h, 1 if checkpoint else 0)


# The keyword options of Node.__init__ with their defaults (tests/python/test_api.py checks
# them against the C table, hs_node_option_name, so that the two cannot drift).
_DEFAULTS: Dict[str, Any] = {
    p.name: p.default for p in inspect.signature(Node.__init__).parameters.values()
    if p.kind is inspect.Parameter.KEYWORD_ONLY}

# Options of `hearsay run`'s trainer that people pass to a node by habit.
_TRAINING = {"lr", "epochs", "eval-every", "batch", "batch-size", "momentum", "weight-decay",
             "model", "data", "optimizer", "local-steps"}


def option_names() -> Tuple[str, ...]:
    """The node's option names as Python keyword arguments (gamma_c, secret_file, ...)."""
    return tuple(_DEFAULTS)


def _option_name(name: str) -> str:
    """The C name of an option given by either spelling; InvalidArgument listing every option
    when there is no such option."""
    c = name.replace("_", "-")
    if c.replace("-", "_") in _DEFAULTS:
        return c
    hint = (" (a training option: it belongs to your own loop and optimizer)"
            if c in _TRAINING else "")
    msg = (f"hearsay.Node has no option {name!r}{hint}; its options are: "
           + ", ".join(_DEFAULTS))
    raise InvalidArgument(EINVAL, "HS_EINVAL", msg, "hearsay.Node")
