"""hearsay.torch: gossip a torch.nn.Module's parameters after each optimizer step.

Gossip puts every parameter of the module into one contiguous float32 buffer and makes the
parameters views of it (as DDP's buckets do), so one hs_node_step works on the whole model in
place with no copy on the CPU. The Parameter objects stay the same, so an optimizer made before
or after sees the same tensors. A CUDA model is staged through one pinned host buffer: device to
host, gossip, host to device, once per step. Buffers (BatchNorm statistics) are not gossiped.
Threading: as hearsay.Node (one thread at a time)."""
import time

import torch

from .node import Node


def flatten_parameters(module):
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
    `g.attach(opt)` instead makes every opt.step() gossip too (check g.running)."""

    def __init__(self, module, node=None, **options):
        self.module = module
        self.flat = flatten_parameters(module)
        self.node = node if node is not None else Node(**options)
        # The C library works in host memory: a CUDA model is staged through pinned memory so
        # the two copies per step run at full bus speed.
        self.host = self.flat
        if self.flat.device.type != "cpu":
            self.host = torch.empty(self.flat.numel(), dtype=torch.float32, pin_memory=True)
        self.steps = 0
        self.seconds = 0.0  # time spent in step(): staging and the gossip round

    @property
    def running(self):
        return self.node.running

    def _to_host(self):
        if self.host is not self.flat:
            self.host.copy_(self.flat, non_blocking=True)
            torch.cuda.current_stream(self.flat.device).synchronize()

    def _from_host(self):
        if self.host is not self.flat:
            self.flat.copy_(self.host, non_blocking=True)

    def start(self):
        """Starts or joins the job from the module's current parameters (every peer of a new job
        should start from the same ones: seed the model's initialisation alike)."""
        self._to_host()
        self.node.start(self.host)
        self._from_host()

    def step(self):
        """One gossip round on the parameters, after optimizer.step(). True while the job goes
        on, False after its last round; raises hearsay.Error otherwise."""
        t0 = time.perf_counter()
        self._to_host()
        try:
            return self.node.step(self.host)
        finally:
            # On an error the node leaves its last consistent vector in host: keep the model
            # equal to it.
            self._from_host()
            self.steps += 1
            self.seconds += time.perf_counter() - t0

    def attach(self, optimizer):
        """Makes optimizer.step() gossip after each update while the job runs; returns the
        optimizer."""
        inner = optimizer.step

        def step(*args, **kwargs):
            out = inner(*args, **kwargs)
            if self.node.running:
                self.step()
            return out

        optimizer.step = step
        return optimizer

    def report(self, loss=float("nan"), accuracy=float("nan")):
        self.node.report(loss, accuracy)

    def metrics(self):
        return self.node.metrics()

    def close(self):
        self.node.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
