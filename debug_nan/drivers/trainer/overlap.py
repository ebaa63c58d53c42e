"""Gradient averaging that overlaps the backward pass, as DDP's reducer does, and can never strand a rank.

DDP launches a bucket's all-reduce as soon as every gradient in it is ready, so communication runs while the
rest of the backward computes. Its reducer has one weakness for a debugger: a rank whose loss raises never runs
its backward, and every other rank waits in a bucket's all-reduce until the process group times out.

Here the collectives of a step are fixed in advance: every rank all-reduces every bucket exactly once, in bucket
order, whatever happens. During the backward of a step's last micro-batch a per-parameter hook counts the
gradients that arrived; a bucket whose gradients all arrived (and whose predecessors were launched) is flattened
and launched asynchronously. `finish()`, which every rank calls after that micro-batch even when its forward, loss
or backward raised, launches the buckets still pending (a rank that raised joins with the gradients it has) and
copies the averages back. The step is then agreed on as before (one all-reduce of phase codes), so a rank that
raised stops every rank, and no rank ever waits on a collective that another rank will not reach.

Each bucket carries one extra element per parameter, 1 where this rank has a gradient for it: a parameter no rank
used keeps `grad = None`, as in a single process, without another collective. The trip check reads the local
gradients before they are averaged (the watch's norms), so the rank that saw a NaN first is still known.

The first step reduces without overlap and learns the order in which gradients arrive: every rank gets the same
bucket layout from it (one all-gather, in the first step's finish(), which every rank reaches). A rank whose
backward delivers some gradient twice (a parameter used in two reentrant checkpoint regions) keeps reducing at
the end of the backward, where the second part cannot be missed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from debug_nan.engine.session.distributed import DistContext

BUCKET_CAP_MB = 25  # DDP's default bucket_cap_mb


def plan_buckets(params: list[torch.Tensor], order: list[int], cap_bytes: int) -> list[list[int]]:
    """Parameter indices grouped into buckets, in `order`: consecutive parameters of one dtype and device, up to
    `cap_bytes` of gradients each (a bigger parameter gets a bucket of its own)."""
    buckets: list[list[int]] = []
    size, key = 0, None
    for i in order:
        p = params[i]
        nbytes = p.numel() * p.element_size()
        if not buckets or (p.dtype, p.device) != key or size + nbytes > cap_bytes:
            buckets.append([])
            size, key = 0, (p.dtype, p.device)
        buckets[-1].append(i)
        size += nbytes
    return buckets


class OverlappedAllReduce:
    """Average the gradients of `params` over the ranks during the backward of the micro-batches it is armed for."""

    def __init__(self, params: list[torch.nn.Parameter], ctx: DistContext, bucket_cap_mb: float = BUCKET_CAP_MB):
        self.params, self.ctx = params, ctx
        self.cap_bytes = int(bucket_cap_mb * 2**20)
        self.index = {id(p): i for i, p in enumerate(params)}
        # before the first step's order is known: reverse registration order (roughly the backward's order)
        self._set_layout(list(reversed(range(len(params)))))
        self.overlap = False  # the first step learns the order; overlap from the second step on
        self.steps = 0
        self.armed = False
        self.late: set[int] = set()  # parameters whose gradient came in two parts after their bucket left
        self._handles = [p.register_post_accumulate_grad_hook(self._arrived) for p in params]

    def _set_layout(self, order: list[int]) -> None:
        self.buckets = plan_buckets(self.params, order, self.cap_bytes)
        self.bucket_of = [0] * len(self.params)
        for b, members in enumerate(self.buckets):
            for i in members:
                self.bucket_of[i] = b

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def describe(self) -> str:
        return (f"{len(self.buckets)} bucket(s) of <= {self.cap_bytes / 2**20:g} MiB, all-reduced during the "
                f"backward of each step's last micro-batch (from step 2 on: step 1 learns their order)")

    # -- one step ------------------------------------------------------------------------------------------------
    def arm(self) -> None:
        """The next backward is the step's last micro-batch's: reduce its gradients as they arrive."""
        self.armed = True
        self._missing = [len(members) for members in self.buckets]
        self._arrivals = [0] * len(self.params)
        self._order: list[int] = []
        self._launched: list[tuple | None] = [None] * len(self.buckets)
        self._next = 0  # buckets are launched in order: every rank issues the same collectives in the same order

    def _arrived(self, param: torch.Tensor) -> None:
        if not self.armed:  # a micro-batch before the last, or a replay: no communication
            return
        i = self.index[id(param)]
        self._arrivals[i] += 1
        if self._arrivals[i] > 1:  # a second part of this gradient: only reducing at the end sees it
            if self._launched[self.bucket_of[i]] is not None:
                self.late.add(i)  # its bucket left already: this step's average lacks it (overlap off from now)
            return
        self._order.append(i)
        b = self.bucket_of[i]
        self._missing[b] -= 1
        if self.overlap and self._missing[b] == 0:
            while self._next < len(self.buckets) and self._missing[self._next] == 0:
                self._launch(self._next)

    def _launch(self, b: int) -> None:
        members = [self.params[i] for i in self.buckets[b]]
        grads = [p.grad.detach() if p.grad is not None else torch.zeros_like(p) for p in members]
        # 1 where this rank has the gradient, made on the device (a host list copied over would sync a GPU)
        used = torch.ones(len(members), dtype=grads[0].dtype, device=grads[0].device)
        for k, p in enumerate(members):
            if p.grad is None:
                used[k] = 0
        # divided before the sum, as DDP does: an fp16 sum of `world` gradients could overflow
        flat = _flatten_dense_tensors(grads + [used]).div_(self.ctx.world)
        self._launched[b] = (flat, grads, used, dist.all_reduce(flat, async_op=True))
        self._next = b + 1

    def finish(self) -> str | None:
        """Every rank calls this once after the armed micro-batch, whatever happened in it: launch what is pending,
        wait, and put the averages in `.grad` (a parameter no rank has a gradient for keeps None). Returns a warning
        for the log when a gradient came too late for its bucket."""
        if not self.armed:
            return None
        self.armed = False
        while self._next < len(self.buckets):
            self._launch(self._next)
        unused_here = []  # (parameter, its average, the bucket's used counts, position): rare
        for b, (flat, grads, used, work) in enumerate(self._launched):
            work.wait()
            members = [self.params[i] for i in self.buckets[b]]
            *averages, used = _unflatten_dense_tensors(flat, grads + [used])
            mine = [(p.grad, avg) for p, avg in zip(members, averages) if p.grad is not None]
            if mine:
                torch._foreach_copy_([g for g, _ in mine], [a for _, a in mine])
            unused_here += [(p, avg, used, k) for k, (p, avg) in enumerate(zip(members, averages)) if p.grad is None]
        if unused_here:  # a gradient this rank does not have: did any rank? (one host read for all of them)
            anyone = torch.stack([used[k] for _, _, used, k in unused_here]).tolist()
            for (p, avg, _, _), u in zip(unused_here, anyone):
                if u > 0:
                    p.grad = avg.clone()
        self._launched = []
        self.steps += 1
        if self.steps == 1:
            self._learn_order()
        if not self.late:
            return None
        self.overlap, self.late = False, set()
        return ("  [ddp] a gradient arrived in two parts after its bucket was sent (a parameter used in two reentrant "
                "checkpoint regions?): averaging after the backward from now on.")

    def _learn_order(self) -> None:
        """After the first step (which every rank finishes): one bucket layout for every rank, in rank 0's arrival
        order, the gradients every rank produced first: a bucket holding a gradient that some rank never produces
        waits for the end of the backward, and with it every bucket after it."""
        orders: list[list[int] | None] = [None] * self.ctx.world
        dist.all_gather_object(orders, self._order)
        everywhere = set.intersection(*(set(o) for o in orders))
        somewhere = [i for i in orders[0] if i not in everywhere] + [
            i for o in orders[1:] for i in o if i not in everywhere and i not in orders[0]]
        order = [i for i in orders[0] if i in everywhere] + list(dict.fromkeys(somewhere))
        order += [i for i in reversed(range(len(self.params))) if i not in set(order)]
        self._set_layout(order)
        self.overlap = max(self._arrivals, default=0) <= 1
