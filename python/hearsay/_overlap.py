"""Gossip with one round in flight (hearsay.torch.Gossip(..., overlap=True)).

Without it, each step stops the training loop for the gossip: device to host copy, the round
(waiting for the neighbours' messages), host to device copy. With it, step k hands the
parameters it has to a worker thread and returns at once; the round runs while step k+1
computes, and step k+1 adds the round's change (the mixed vector minus the one sent) to the
parameters it has by then. The model thus takes each gossip change one step late: a staleness
of one step, the kind decentralized SGD tolerates (SGP runs with bounded staleness by design;
for D-PSGD and CHOCO it is a delayed consensus step whose size the step rule already bounds).
With no local update between two steps this is exactly the synchronous gossip.

On a CUDA model the copies run on a side stream: the snapshot of the parameters (device to
device) is the only thing the compute stream waits for; the device to host copy, the round and
the host to device copy of the change overlap with the next step's compute. The pinned host
buffer and the device buffers are allocated once. The C node is still used by one thread at a
time: the worker's round is waited for before anything else touches the node."""
import concurrent.futures
import math
from typing import Any, Optional, Tuple

import torch

# torch.cuda's streams and events carry no type annotations: held as Any.
_cuda: Any = torch.cuda


class Pipeline:
    """The buffers and the worker of one Gossip's overlapped rounds."""

    def __init__(self, flat: torch.Tensor, node: Any) -> None:
        self.flat = flat
        self.node = node
        self.cuda = flat.device.type == "cuda"
        n = flat.numel()
        # host: the node's vector (the C library works in host memory); sent: the parameters
        # as handed to the round; change: the round's result minus sent, on the device.
        self.host = torch.empty(n, dtype=torch.float32, pin_memory=self.cuda)
        self.sent = torch.empty_like(flat)
        self.change = torch.empty_like(flat)
        self.stream: Any = None
        if self.cuda:
            self.stream = _cuda.Stream(flat.device)
            self.snapped: Any = _cuda.Event()
            self.copied: Any = _cuda.Event()
            self.ready: Any = _cuda.Event()
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hearsay-gossip")
        self.future: Optional["concurrent.futures.Future[bool]"] = None
        self.report: Tuple[float, float] = (math.nan, math.nan)

    def submit(self) -> None:
        """Hands the parameters as they are now to a round on the worker."""
        if self.stream is not None:
            cur = _cuda.current_stream(self.flat.device)
            self.stream.wait_stream(cur)  # the optimizer step that wrote them
            with _cuda.stream(self.stream):
                self.sent.copy_(self.flat)
                self.snapped.record(self.stream)
                self.host.copy_(self.sent, non_blocking=True)
                self.copied.record(self.stream)
            cur.wait_event(self.snapped)  # the next step may write flat once it is copied
        else:
            self.sent.copy_(self.flat)
            self.host.copy_(self.sent)
        report, self.report = self.report, (math.nan, math.nan)
        self.future = self.pool.submit(self._round, report)

    def _round(self, report: Tuple[float, float]) -> bool:
        if self.stream is not None:
            self.copied.synchronize()
        self.node.report(*report)
        try:
            going: bool = self.node.step(self.host)
        finally:
            # On an error the node leaves its last consistent vector in host: the change is
            # then whatever the round got to, never garbage.
            if self.stream is not None:
                with _cuda.stream(self.stream):
                    self.change.copy_(self.host, non_blocking=True)
                    self.change.sub_(self.sent)
                    self.ready.record(self.stream)
            else:
                torch.sub(self.host, self.sent, out=self.change)
        return going

    def in_flight(self) -> bool:
        return self.future is not None

    def wait(self) -> None:
        """Waits for the round in flight without applying it (the node is free afterwards)."""
        if self.future is not None:
            concurrent.futures.wait([self.future])

    def collect(self) -> bool:
        """Applies the round in flight to the parameters; returns whether the job goes on
        (raises the round's hearsay.Error, after applying what it left)."""
        fut, self.future = self.future, None
        if fut is None:
            return True
        concurrent.futures.wait([fut])
        if self.stream is not None:
            _cuda.current_stream(self.flat.device).wait_event(self.ready)
        with torch.no_grad():
            self.flat.add_(self.change)
        return fut.result()

    def close(self) -> None:
        self.wait()
        self.pool.shutdown(wait=True)
