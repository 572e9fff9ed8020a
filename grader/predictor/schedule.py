"""Megatron-LM's pipeline schedules: one forward, one backward (1F1B), and its interleaved variant, in which each
pipeline rank holds v model chunks (rank r holds chunks r, r + p, r + 2p, ... of the p·v chunks).

Each rank runs a list of steps; in the steady state a step is one forward and one backward, then one exchange
with its neighbours. Microbatch k of the rank's m·v forward "units" runs chunk (k mod p·v) // p of microbatch
(k // p·v)·p + k mod p: the microbatches go through a chunk in groups of p before the next chunk.

    warm-up forwards    1F1B: p - r - 1          interleaved: 2(p - r - 1) + (v - 1)·p   (all m·v when m = p)
    steady state        one forward and one backward, m·v - warm-up times
    cool-down           the backwards left

Bubble: the first forward of the last stage starts after (p - 1) forwards of a chunk have crossed the pipeline,
so an idle fraction of (p - 1)/(v·m + p - 1) of the step (Narayanan et al. 2021), (p - 1)/(v·m) of the ideal time.

Messages (Megatron's p2p_communication): the rank's activations go to the next rank (the last rank's, to rank 0's
next chunk), gradients back. Each exchange posts its sends and receives together and waits for all of them, as
Megatron's batched isend/irecv does; the forward direction is posted first (a rank's sends run in the order it
posts them, and its receives likewise, so the two directions in one fixed order never wait for each other in a
circle).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Unit:
    """One forward or backward of one chunk on one microbatch."""

    forward: bool
    chunk: int
    microbatch: int

    def __str__(self) -> str:
        return f"{'F' if self.forward else 'B'}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


def chunk_of(k: int, p: int, v: int, forward: bool) -> int:
    c = (k % (p * v)) // p
    return c if forward else v - 1 - c


def microbatch_of(k: int, p: int, v: int) -> int:
    return (k // (p * v)) * p + k % p


def warmup(rank: int, p: int, v: int, m: int) -> int:
    """How many forwards rank `rank` runs before its first backward."""
    if v == 1:
        return min(p - rank - 1, m)
    return m * v if m == p else min((p - rank - 1) * 2 + (v - 1) * p, m * v)


def order(rank: int, p: int, v: int, m: int) -> list[Unit]:
    """The forwards and backwards rank `rank` runs, in order."""
    total, w = m * v, warmup(rank, p, v, m)
    f = [Unit(True, chunk_of(k, p, v, True), microbatch_of(k, p, v)) for k in range(total)]
    b = [Unit(False, chunk_of(k, p, v, False), microbatch_of(k, p, v)) for k in range(total)]
    out = f[:w]
    for k in range(total - w):
        out += [f[w + k], b[k]]
    return out + b[total - w:]


class Pipe:
    """A rank's messages to and from its neighbouring pipeline ranks. `shape`: what crosses a stage boundary.
    With a tensor-parallel group and no sequence parallelism each rank sends its 1/t of the activation and the
    receiver all-gathers it over its group (Megatron's scatter-gather optimisation: the t ranks of a stage hold
    the same activation, and InfiniBand is slower than NVLink)."""

    def __init__(self, dist, rank: int, ranks: list[int], shape, dtype, device, tp, scatter: bool):
        self.dist, self.p = dist, len(ranks)
        self.stage = rank
        self.prev, self.next = ranks[(rank - 1) % self.p], ranks[(rank + 1) % self.p]
        self.shape, self.dtype, self.device, self.tp = tuple(shape), dtype, device, tp
        self.scatter = scatter and tp.size > 1

    def _piece_shape(self):
        n = 1
        for d in self.shape:
            n *= d
        return (n // self.tp.size,) if self.scatter else self.shape

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if not self.scatter:
            return t.contiguous()
        flat = t.reshape(-1)
        n = flat.shape[0] // self.tp.size
        return flat[self.tp.rank * n: (self.tp.rank + 1) * n]

    def _unpack(self, piece: torch.Tensor) -> torch.Tensor:
        if not self.scatter:
            return piece
        full, handle = self.tp.all_gather(piece)
        if handle is not None:
            handle.wait()
        return full.view(self.shape)

    def exchange(self, send_next=None, recv_prev=False, send_prev=None, recv_next=False):
        """Post the sends and receives together, wait for all; return (from prev, from next)."""
        ops, got = [], {}
        if send_next is not None:
            ops.append(self.dist.isend(self._pack(send_next), self.next))
        if recv_prev:
            got["prev"] = torch.empty(self._piece_shape(), dtype=self.dtype, device=self.device)
            ops.append(self.dist.irecv(got["prev"], self.prev))
        if send_prev is not None:
            ops.append(self.dist.isend(self._pack(send_prev), self.prev))
        if recv_next:
            got["next"] = torch.empty(self._piece_shape(), dtype=self.dtype, device=self.device)
            ops.append(self.dist.irecv(got["next"], self.next))
        for op in ops:
            op.wait()
        return (self._unpack(got["prev"]) if "prev" in got else None,
                self._unpack(got["next"]) if "next" in got else None)


def steps(rank: int, p: int, v: int, m: int) -> list[list[Unit]]:
    """The units grouped by the exchanges between them. 1F1B exchanges after every unit (after a forward: send
    it, receive the gradient the next backward needs; after a backward: send its gradient, receive the next
    input). The interleaved schedule pairs each steady-state forward with the backward after it and exchanges
    once per pair (Megatron's send_forward_backward_recv_forward_backward)."""
    units = order(rank, p, v, m)
    if v == 1:
        return [[u] for u in units]
    w = warmup(rank, p, v, m)
    steady = m * v - w  # forward-backward pairs
    rest = units[w:]
    return ([[u] for u in units[:w]] + [rest[2 * i: 2 * i + 2] for i in range(steady)]
            + [[u] for u in rest[2 * steady:]])


def run_schedule(pipe: Pipe, v: int, m: int, forward, backward, sent=None) -> None:
    """Run rank `pipe.stage`'s units in Megatron's order. forward(unit, x) -> y runs a chunk (x: the received
    activation, None where the chunk starts the model; y is not sent where it ends it); backward(unit, g) -> dx
    runs its backward (g: the received gradient, None at the end of the model; dx is not sent at its start).
    sent(y), if given, is called once y has been sent."""
    p, r = pipe.p, pipe.stage
    starts = lambda u: u.chunk == 0 and r == 0  # noqa: E731  the unit starts the model: no input to receive
    ends = lambda u: u.chunk == v - 1 and r == p - 1  # noqa: E731  it ends the model: nothing to send on
    plan = steps(r, p, v, m)
    first = plan[0][0]
    x, _ = pipe.exchange(recv_prev=not starts(first)) if first.forward else (None, None)
    inputs = {first: x}
    for n, step in enumerate(plan):
        y = dx = None
        for u in step:
            if u.forward:
                y = forward(u, inputs.pop(u))
                y = None if ends(u) else y
            else:
                dx = backward(u, inputs.pop(u))
                dx = None if starts(u) else dx
        following = plan[n + 1] if n + 1 < len(plan) else []
        wants_x = [u for u in following if u.forward and not starts(u)]
        wants_g = [u for u in following if not u.forward and not ends(u)]
        got_x, got_g = pipe.exchange(send_next=y, recv_prev=bool(wants_x), send_prev=dx, recv_next=bool(wants_g))
        if y is not None and sent is not None:
            sent(y)
        for u in following:
            inputs[u] = (got_x if u in wants_x else got_g if u in wants_g else None)
