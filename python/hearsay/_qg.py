"""Quasi-global momentum for torch.optim.SGD under gossip (Gossip(..., momentum_kind="qg")).

torch's SGD keeps heavy-ball momentum on the local gradients: m = beta m + g. Under gossip the
buffer then never sees the consensus moves, and each peer's momentum amplifies its own drift.
Quasi-global momentum (Lin, Karimireddy, Stich and Jaggi, "Quasi-Global Momentum: Accelerating
Decentralized Deep Learning on Heterogeneous Data", ICML 2021, Algorithm 1) builds the buffer
from the model's whole change across a round, gossip included:

    each local step:   m = beta mhat + g          (not written back)
                       x = x - lr m
    after the gossip:  d = (x_round_start - x_after_gossip) / (sum of the round's lrs)
                       mhat = beta mhat + (1 - beta) d

the same rule as the C trainer's --momentum-kind qg (include/hearsay/model.h). torch's own step
does the arithmetic (weight decay and Nesterov included): between rounds its buffer holds mhat;
a round's first step snapshots it and x, later steps of the same round start from the snapshot
again, and the round's end writes the new mhat into the buffer. So torch's optimizer
state_dict() carries mhat and a resumed optimizer goes on with it."""
import functools
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch


def qg_refusal(opt: torch.optim.Optimizer) -> Optional[str]:
    """Why quasi-global momentum cannot drive opt, or None when it can: it needs torch's SGD
    with momentum > 0 and no dampening in every parameter group (with dampening the buffer's
    scale is not the step's)."""
    if not isinstance(opt, torch.optim.SGD):
        return f"the optimizer is {type(opt).__name__}, not torch.optim.SGD"
    for i, g in enumerate(opt.param_groups):
        if not g.get("momentum", 0) > 0:
            return f"parameter group {i} has momentum {g.get('momentum', 0)} (needs > 0)"
        if g.get("dampening", 0) != 0:
            return f"parameter group {i} has dampening {g['dampening']} (needs 0)"
    return None


class QuasiGlobal:
    """Quasi-global momentum for the parameters of opt that are views of flat (the gossiped
    vector); other parameters keep torch's local momentum. Hooks opt.step (begin/accumulate);
    round_end() is called after each gossip round with flat as the round left it; active()
    says whether the job runs."""

    def __init__(self, opt: torch.optim.Optimizer, flat: torch.Tensor,
                 params: List[torch.nn.Parameter]) -> None:
        why = qg_refusal(opt)
        if why is not None:
            raise ValueError(f"hearsay.torch: momentum_kind='qg': {why}")
        self.opt = opt
        self.flat = flat
        offsets: Dict[int, Tuple[int, int]] = {}
        off = 0
        for p in params:
            offsets[id(p)] = (off, p.numel())
            off += p.numel()
        # (group index, parameter, offset, size) of every gossiped parameter opt updates.
        self.slots: List[Tuple[int, torch.nn.Parameter, int, int]] = []
        for gi, g in enumerate(opt.param_groups):
            for p in g["params"]:
                if id(p) in offsets:
                    self.slots.append((gi, p, *offsets[id(p)]))
        if not self.slots:
            raise ValueError("hearsay.torch: momentum_kind='qg': the optimizer updates none of "
                             "the module's parameters")
        self.x0 = torch.empty_like(flat)    # x at the round's start
        self.mhat = torch.zeros_like(flat)  # the buffer at the round's start
        self.lr_sum = [0.0] * len(opt.param_groups)
        self.in_round = False
        # Whether the job runs (Gossip sets it): outside it the steps are torch's own.
        self.active: Callable[[], bool] = lambda: True
        inner = opt.step

        # wraps: an lr scheduler made before marks opt.step and warns when the mark is gone.
        @functools.wraps(inner)
        def step(*args: Any, **kwargs: Any) -> Any:
            self._before_step()
            return inner(*args, **kwargs)

        opt.step = step  # type: ignore[assignment]

    def _buffer(self, p: torch.nn.Parameter) -> Optional[torch.Tensor]:
        buf = self.opt.state[p].get("momentum_buffer") if p in self.opt.state else None
        return buf if isinstance(buf, torch.Tensor) else None

    @torch.no_grad()
    def _before_step(self) -> None:
        if not self.active():
            # No round will end (the job is over): torch's own heavy ball from the buffer the
            # last round left, not every step reset to that mhat (a momentum that stood still).
            return
        if not self.in_round:
            # The round's first step: x and the buffer as the last round (or a load) left them.
            self.x0.copy_(self.flat)
            for _, p, off, n in self.slots:
                buf = self._buffer(p)
                if buf is None:
                    self.mhat[off:off + n].zero_()
                else:
                    self.mhat[off:off + n].copy_(buf.view(-1))
            self.lr_sum = [0.0] * len(self.opt.param_groups)
            self.in_round = True
        else:
            # A later step of the same round: m = beta mhat + g again, not beta m + g.
            for _, p, off, n in self.slots:
                buf = self._buffer(p)
                if buf is not None:
                    buf.view(-1).copy_(self.mhat[off:off + n])
        for gi, g in enumerate(self.opt.param_groups):
            self.lr_sum[gi] += float(g["lr"])

    @torch.no_grad()
    def round_end(self) -> None:
        """Folds the round's model change (local steps and gossip) into the buffer. A round with
        no optimizer step, or only lr 0, leaves the buffer as it was."""
        if not self.in_round:
            return
        self.in_round = False
        for gi, p, off, n in self.slots:
            buf = self._buffer(p)
            lr = self.lr_sum[gi]
            if buf is None:
                continue  # no gradient reached p this round: torch made no buffer
            if not lr > 0:
                buf.view(-1).copy_(self.mhat[off:off + n])
                continue
            beta = float(self.opt.param_groups[gi]["momentum"])
            d = (self.x0[off:off + n] - self.flat[off:off + n]) / lr
            b = buf.view(-1)
            b.copy_(self.mhat[off:off + n]).mul_(beta).add_(d, alpha=1.0 - beta)
