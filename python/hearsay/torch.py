"""hearsay.torch: gossip a torch.nn.Module's parameters after each optimizer step.

Gossip puts every parameter of the module into one contiguous float32 buffer and makes the
parameters views of it (as DDP's buckets do), so one hs_node_step works on the whole model in
place with no copy on the CPU. The Parameter objects stay the same, so an optimizer made before
or after sees the same tensors. A CUDA model is staged through one pinned host buffer: device to
host, gossip, host to device, once per step. Buffers are not gossiped: a module with BatchNorm
running statistics is refused (GroupNorm recommended) unless allow_local_buffers=True.
Threading: as hearsay.Node (one thread at a time)."""
import ctypes
import functools
import time
from typing import Any, Dict, List, Mapping, Optional

import torch

from . import _lib, average as _average
from ._overlap import Pipeline
from ._qg import QuasiGlobal, qg_refusal
from .errors import Error
from .node import Node, OptionValue, _option_name


def check_buffers(module: torch.nn.Module) -> None:
    """Refuses (ValueError) a module whose float buffers would silently differ between peers:
    BatchNorm's running statistics are buffers, not parameters, so the gossip does not average
    them and each peer would evaluate with its own. GroupNorm (or LayerNorm) normalises
    without running statistics and gossips as it is."""
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            raise ValueError(
                f"hearsay.torch: {name or 'the module'} is {type(m).__name__}: its running "
                "statistics are buffers that the gossip does not average, so each peer would "
                "evaluate with its own; use torch.nn.GroupNorm (or BatchNorm with "
                "track_running_stats=False), or pass allow_local_buffers=True to keep them "
                "local on purpose")


def flatten_parameters(module: torch.nn.Module) -> torch.Tensor:
    """Moves the module's parameters into one new contiguous buffer and makes them views of it;
    returns the buffer. All parameters must be float32 on one device (TypeError otherwise)."""
    params = list(module.parameters())
    if not params:
        raise ValueError("hearsay.torch: the module has no parameters")
    dev = params[0].device
    for p in params:
        if p.dtype != torch.float32:
            raise TypeError(f"hearsay.torch: a parameter of shape {tuple(p.shape)} is {p.dtype}; "
                            "the gossip works on float32 parameters only")
        if p.device != dev:
            raise TypeError(f"hearsay.torch: parameters on {dev} and {p.device}; one device only")
    flat = torch.empty(sum(p.numel() for p in params), dtype=torch.float32, device=dev)
    off = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            view = flat[off:off + n].view_as(p)
            view.copy_(p)
            p.data = view
            off += n
    return flat


def _check_qg(opt: torch.optim.Optimizer, node: Node) -> None:
    """Refuses (ValueError, with the reason) quasi-global momentum where it cannot apply: an
    optimizer other than torch SGD with momentum, or an algorithm whose mixing does not keep
    the average (the C trainer's rule, hs_algo_kind_qg_momentum)."""
    why = qg_refusal(opt)
    algo = str(node._given.get("algo") or _lib.default_algo())
    kind = ctypes.c_int()
    L = _lib.lib()
    if why is None and L.hs_algo_kind_parse(algo.encode(), ctypes.byref(kind)) == 0 and \
            not L.hs_algo_kind_qg_momentum(kind.value):
        why = f"algo {algo!r}'s mixing does not keep the network's average, which qg needs"
    if why is not None:
        raise ValueError(f"hearsay.torch: momentum_kind='qg': {why}")


def _check_kind(kind: str) -> None:
    if kind not in ("local", "qg"):
        raise ValueError(f"hearsay.torch: momentum_kind={kind!r}: expected 'local' or 'qg'")


class Gossip:
    """A module's parameters gossiped through a hearsay node after each optimizer step.

        g = hearsay.torch.Gossip(model, algo="choco", compress="topk:0.01", world=4, rank=r,
                                 rendezvous="job.addr", insecure=True, rounds=1000)
        g.start()                       # the job's vector is loaded when joining
        for xb, yb in loader:
            opt.zero_grad(); F.cross_entropy(model(xb), yb).backward(); opt.step()
            if not g.step():            # False after the job's last round
                break
        g.close()

    `node` may be a hearsay.Node made beforehand; otherwise the keyword options make one.
    `g.attach(opt)` instead makes every opt.step() gossip too (check g.running).
    `overlap=True` keeps one round in flight: step() returns at once and the round runs while
    the next step computes; its change reaches the parameters one step late (hearsay._overlap
    says why that is sound). For CUDA models this hides the copies and the round behind the
    compute. `allow_local_buffers=True` accepts BatchNorm running statistics, which then stay
    each peer's own.

    `momentum_kind="qg"` with `optimizer=opt` (or `g.attach(opt, momentum_kind="qg")`, opt a
    torch.optim.SGD with momentum) gives opt quasi-global momentum (hearsay._qg; Lin et al.
    2021): its buffer follows each round's whole model change, gossip included, as `hearsay run
    --momentum-kind qg`. The default, "local", leaves torch's own momentum alone: on the IID
    PyTorch example qg cost 0.8 point at a constant lr and 5 with a cosine decay
    (docs/RESULTS.md, "PyTorch defaults"). It is meant for skewed (non-IID) shards, where
    `hearsay sim` measured it 0.5-1.5 points above local momentum (not measured through
    hearsay.torch). `g.momentum_kind` says which one runs. Outside the job (before start(),
    after its last round) opt's steps are torch's own heavy ball again.

    `final_average="fp16"` (or "none", or another compressor that D-PSGD accepts) makes the
    step that ends the job also give every peer the mean of all the peers' parameters
    (hearsay.average: a short job of dimension-exchange rounds, log2(n) model-sized messages
    per peer, 2 bytes a value at fp16; `average_options` are that job's node options). Gossip
    leaves each peer near the mean, not at it, and after few epochs under compression that
    spread costs accuracy. `g.average()` does the same by hand. `g.averaged` holds what the
    last average cost (rounds, bytes_sent, seconds), None before one."""

    def __init__(self, module: torch.nn.Module, node: Optional[Node] = None,
                 allow_local_buffers: bool = False, overlap: bool = False,
                 optimizer: Optional[torch.optim.Optimizer] = None,
                 momentum_kind: str = "local", final_average: Optional[str] = None,
                 average_options: Optional[Mapping[str, OptionValue]] = None,
                 **options: OptionValue) -> None:
        if not allow_local_buffers:
            check_buffers(module)
        for k in options:
            _option_name(k)  # InvalidArgument listing every option
        _check_kind(momentum_kind)
        self.module = module
        params = list(module.parameters())
        self.flat = flatten_parameters(module)
        self.node = node if node is not None else Node(options)
        self._qg: Optional[QuasiGlobal] = None
        self.momentum_kind = "local"
        if momentum_kind == "qg":
            try:
                if optimizer is None:
                    raise ValueError("hearsay.torch: momentum_kind='qg' needs optimizer=")
                self._use_qg(optimizer, params)
            except ValueError:
                if node is None:
                    self.node.close()  # made here: nobody else would free it
                raise
        # The C library works in host memory: a CUDA model is staged through pinned memory so
        # the two copies per step run at full bus speed.
        self.host = self.flat
        self._pipe: Optional[Pipeline] = None
        self._going = True  # what the round collected outside step() said
        if overlap:
            self._pipe = Pipeline(self.flat, self.node)
            self.host = self._pipe.host  # the pinned buffer serves start() too
        elif self.flat.device.type != "cpu":
            self.host = torch.empty(self.flat.numel(), dtype=torch.float32, pin_memory=True)
        self.steps = 0
        self.seconds = 0.0  # time spent in step(): staging and the gossip round
        self.final_average = final_average
        self.average_options = dict(average_options or {})
        self.averaged: Optional[Dict[str, Any]] = None

    def _use_qg(self, opt: torch.optim.Optimizer, params: List[torch.nn.Parameter]) -> None:
        _check_qg(opt, self.node)
        self._qg = QuasiGlobal(opt, self.flat, params)
        # Rounds follow while the job runs, and with overlap until its last one is collected.
        self._qg.active = lambda: self.node.running or (
            self._pipe is not None and self._pipe.in_flight())
        self.momentum_kind = "qg"

    @property
    def running(self) -> bool:
        return self.node.running

    def _to_host(self) -> None:
        if self.host is not self.flat:
            self.host.copy_(self.flat, non_blocking=True)
            if self.flat.device.type == "cuda":
                torch.cuda.current_stream(self.flat.device).synchronize()  # type: ignore[no-untyped-call]

    def _from_host(self) -> None:
        if self.host is not self.flat:
            with torch.no_grad():
                self.flat.copy_(self.host, non_blocking=True)

    def _settle(self) -> None:
        """Applies the round in flight (overlap), so that the node and the parameters agree."""
        if self._pipe is not None and self._pipe.in_flight():
            self._going = self._pipe.collect()

    def start(self) -> None:
        """Starts or joins the job from the module's current parameters (every peer of a new job
        should start from the same ones: seed the model's initialisation alike)."""
        self._to_host()
        self.node.start(self.host)
        self._from_host()

    def step(self) -> bool:
        """One gossip round on the parameters, after optimizer.step(). True while the job goes
        on, False after its last round; raises hearsay.Error otherwise."""
        t0 = time.perf_counter()
        if self._pipe is not None:
            try:
                going = self._pipe.collect() if self._pipe.in_flight() else self._going
                self._going = True
                if self._qg is not None:
                    self._qg.round_end()  # the local steps and the last round's change
                if going:
                    self._pipe.submit()
                    self.steps += 1
                elif self.final_average is not None and self.averaged is None:
                    self.average(self.final_average, self.average_options)
                return going
            finally:
                self.seconds += time.perf_counter() - t0
        self._to_host()
        try:
            going = self.node.step(self.host)
        finally:
            # On an error the node leaves its last consistent vector in host: keep the model
            # equal to it.
            self._from_host()
            self.steps += 1
            self.seconds += time.perf_counter() - t0
        if self._qg is not None:
            self._qg.round_end()
        if not going and self.final_average is not None and self.averaged is None:
            t0 = time.perf_counter()
            self.average(self.final_average, self.average_options)
            self.seconds += time.perf_counter() - t0
        return going

    def average(self, compress: str = "fp16",
                options: Optional[Mapping[str, OptionValue]] = None) -> Dict[str, Any]:
        """Makes the parameters the mean of every peer's (hearsay.average.average): each peer
        of the job calls it once, after the job's last round. The averaging job's options
        come from the node's (world, rank, security, a rendezvous PATH.average or the ports
        above listen/bootstrap); `options` win. Returns (and keeps in g.averaged) what it
        cost: rounds, bytes_sent, seconds. Raises hearsay.Error when that job fails,
        RuntimeError on a second call (the averaging job's meeting place is per job) and when
        a neighbour's vector did not come: the parameters then hold the partial mix (as
        hearsay.average.average leaves x), not the mean."""
        if self.averaged is not None:
            raise RuntimeError("hearsay.torch: Gossip.average: this job's parameters were "
                               "averaged already (once per job)")
        self._settle()
        given = dict(self.node._given)
        rank = self.node.rank
        if "rank" not in given and rank is not None:
            given["rank"] = rank  # the joins' order: rank 0 meets the others
        self._to_host()
        try:
            self.averaged = _average.average(self.host, given, compress, options)
        finally:
            self._from_host()
        return self.averaged

    def state_dict(self) -> Dict[str, Any]:
        """The gossip state now, between two steps, for torch.save beside the model's and the
        optimizer's: the node's (Node.state_dict: the vector, the algorithm's state, the round,
        the job's end; whatever the C node saves, such as an outer optimizer's state, rides in
        it) and this wrapper's step count. Extra entries of a subclass go under "extra". With
        overlap, the round in flight is applied first."""
        self._settle()
        return {"format": "hearsay-gossip-state", "version": 1, "node": self.node.state_dict(),
                "steps": self.steps, "extra": self._extra_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes start() continue from a state_dict(): the parameters become the saved vector
        and the job goes on from the saved round. Before start only."""
        if not isinstance(state, dict) or state.get("format") != "hearsay-gossip-state":
            raise ValueError("hearsay.torch: not a Gossip.state_dict()")
        self.node.load_state_dict(state["node"])
        self.steps = int(state.get("steps", 0))
        self._load_extra_state(state.get("extra") or {})

    def _extra_state(self) -> Dict[str, Any]:
        """Extension point: state of a subclass (plain values), saved under "extra"."""
        return {}

    def _load_extra_state(self, extra: Mapping[str, Any]) -> None:
        """Extension point: restores what _extra_state saved."""

    def attach(self, optimizer: torch.optim.Optimizer,
               momentum_kind: str = "local") -> torch.optim.Optimizer:
        """Makes optimizer.step() gossip after each update while the job runs; returns the
        optimizer. momentum_kind="qg" gives it quasi-global momentum (as Gossip's
        momentum_kind with optimizer=)."""
        _check_kind(momentum_kind)
        if momentum_kind == "qg":
            if self._qg is None:
                self._use_qg(optimizer, list(self.module.parameters()))
            elif self._qg.opt is not optimizer:
                raise ValueError("hearsay.torch: momentum_kind='qg' drives another optimizer "
                                 "already (one per Gossip)")
        inner = optimizer.step

        @functools.wraps(inner)  # keeps an lr scheduler's mark on opt.step (no warning)
        def step(*args: Any, **kwargs: Any) -> Any:
            out = inner(*args, **kwargs)
            if self.node.running:
                self.step()
            return out

        optimizer.step = step  # type: ignore[assignment]
        return optimizer

    def report(self, loss: float = float("nan"), accuracy: float = float("nan")) -> None:
        """This step's loss and accuracy, for the metrics and the guard (with overlap they go
        with the round the next step() hands over)."""
        if self._pipe is not None:
            self._pipe.report = (loss, accuracy)
        else:
            self.node.report(loss, accuracy)

    def metrics(self) -> Optional[Dict[str, Any]]:
        """The last finished round's metrics record (Node.metrics)."""
        if self._pipe is not None:
            self._pipe.wait()
        return self.node.metrics()

    def close(self) -> None:
        """Applies a round still in flight, then leaves and frees the node."""
        if self._pipe is not None:
            try:
                self._settle()
            except Error:
                pass  # closing after a failed round: the parameters hold what it left
            self._pipe.close()
        self.node.close()

    def __enter__(self) -> "Gossip":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
