"""Puzzle 6 — Pipeline parallel, one forward one backward (1F1B).

GPipe (puzzle 5) runs every forward before any backward, so rank 0 keeps the activations of all m microbatches
alive at once: memory grows with m, the very number you raise to shrink the bubble. But microbatch 0's gradient
can come back as soon as microbatch 0 has been through the last stage. 1F1B starts each backward as early as
that: rank r runs p-1-r *warm-up* forwards, then alternates one forward and one backward (the *steady state*),
then runs the backwards left over (the *cool-down*). Rank 0 never holds more than p microbatches, whatever m:

    time -->  (Fi: microbatch i's forward through one stage, F; Bi===: its backward, BW, about 2.7F; .: idle)
    rank 0  F0F1F2F3...............B0===F4B1===F5B2===F6B3===F7B4===..B5===..B6===..B7===
    rank 1  ..F0F1F2..........B0===F3B1===F4B2===F5B3===F6B4===F7B5===..B6===..B7===.....
    rank 2  ....F0F1.....B0===F2B1===F3B2===F4B3===F5B4===F6B5===F7B6===..B7===..........
    rank 3  ......F0B0===F1B1===F2B2===F3B3===F4B4===F5B5===F6B6===F7B7===...............
            warm-up: 3, 2, 1, 0 forwards; then F, B, F, B, ...; cool-down: the last 3, 2, 1, 0 backwards

The makespan and the bubble, (p-1)/(m+p-1) = 3/11 = 27.3%, are GPipe's: 1F1B buys memory, not time.

Each backward is of the *oldest* microbatch still held (first in, first out), the one whose gradient arrives
next. In the steady state a rank sends an activation forward and a gradient back while its neighbours do the same
towards it. A blocking send waits for its recv (here always; on real backends, whenever the message is too big to
buffer), so if rank r sends forward while rank r+1 sends back, both wait forever. Post a send and the receive
that goes with it together, with `dist.batch_isend_irecv([dist.P2POp(dist.isend, t, peer), dist.P2POp(dist.irecv,
buf, peer)])` (then `wait()` on every handle it returns), or with isend/irecv and wait on both.

Write `one_f_one_b_step(dist, layers, x, target, n_micro, micro_shape)`, with puzzle 5's contract:
  - `layers`: this stage's 2 blocks, a list of (w1 [64, 256], w2 [256, 64]) pairs with requires_grad;
  - `x`: the batch, [64, 64], on rank 0 (None on the other ranks); `target`: [64, 64] on the last rank (else None);
  - `n_micro`: m = 8; microbatch i is rows 8i to 8i+7 (`x.chunk(n_micro)[i]`, `target.chunk(n_micro)[i]`);
  - `micro_shape`: (8, 64), the shape of one microbatch's activations between stages and of their gradients:
    allocate receive buffers with it (`torch.empty(micro_shape, dtype=torch.float64)`).
  Leave the gradient of the full-batch loss `loss_fn(forward(x, all layers), target)` in `w.grad` of this stage's
  weights (they start as zeros; backward adds into them), accumulated over the microbatches (each microbatch's
  loss is `loss_fn(y, target_i) / n_micro`), and return the gradient of the loss with respect to this stage's
  input for the whole batch ([64, 64], microbatch i in rows 8i to 8i+7; on rank 0, dL/dx).

The clock (puzzle 5's: the puzzles' GPU, CostModel(latency_ticks=0, bytes_per_tick=4096)): one stage's forward
of one microbatch is F = 1,100 ticks, its backward BW = 2,940 ticks, the last stage's loss LF + LB = 75 ticks more,
a message 1 tick.

Checks (sizes: p=4 ranks, m=8 microbatches, batch 64, d=64, h=256, L=8 blocks, 2 per stage):
  - stage gradients and input gradients: equal to the serial reference, as in puzzle 5.
  - stage compute: each rank's own blocks, each microbatch forward once and backward once, every op counted, at
    most m·(F + BW + LF + LB) + m·mb·d = 25,800,848 FLOPs (F = 1,053,696, BW = 2,167,808), and at least
    25,165,824 FLOPs of matmuls, as in puzzle 5: no recomputation.
  - bubble: 1 - W/makespan, W = m·(F + BW + LF + LB) = 32,920 ticks the last stage's own work, at most
    (p-1)/(m+p-1) + 0.5 points = 27.3% + 0.5 points = 27.8%, as in puzzle 5 (and, as there, read off the clock only
    once every stage's work is on it where its messages say it ran).
  - 1F1B schedule: on every rank, the microbatches it holds (forwards begun minus backwards done, read off the
    FLOPs it computed: a forward of F outside backward, a backward of BW inside it) never exceed p - rank: 4 on
    rank 0, 3 on rank 1, 2 on rank 2, 1 on rank 3. The order of your code does not matter; what ran does. GPipe's
    order holds m = 8, and so does GPipe's order with recomputation.
  - stage-0 activation memory: rank 0's peak memory less its weights, their gradients, x and the returned dL/dx
    (2·2·d·h·8 + 2·2·d·h·8 + 2·B·d·8 = 1,114,112 bytes) is at most p·A + d·h·8 + A/2 = 462,848 bytes. Here
    A = 2·(2·8·h + 8·d)·8 = 73,728 bytes is one microbatch's activations on one stage (per block, x@w1 and its
    gelu, [8, 256] each, and the block's output, [8, 64]); d·h·8 = 131,072 bytes is the fresh gradient of one
    weight before autograd adds it into w.grad; A/2 = 36,864 bytes is slack for receive buffers and
    temporaries. 1F1B holds p = 4 microbatches on rank 0 (4·A = 294,912 bytes); GPipe's order holds all m = 8
    (8·A = 589,824 bytes).
  - a deadlock is an error, reported with what each rank waits for.
  - keep everything as torch tensors (the grader refuses a tensor turned into a numpy array, a Python list or
    bytes, which its memory ledger could not see).

Hints:
  - The number of microbatches a rank holds is the number of forwards it has run minus the backwards: count them.
  - Keep the microbatches a rank holds in a queue (collections.deque): append after a forward, popleft before a
    backward.
  - `torch.profiler.record_function(f"F{i}")` / `(f"B{i}")` around a microbatch's work names it on the schedule chart.
"""

from collections import deque

import torch

from puzzles.model import forward, loss_fn


def one_f_one_b_step(dist, layers, x, target, n_micro, micro_shape):
    # BEGIN SOLUTION
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1

    def exchange(send_next=None, send_prev=None, recv_prev=False, recv_next=False):
        """Post the sends and receives of one step together, so that no two neighbours wait on each other."""
        ops, act, grad = [], None, None
        if send_next is not None and not last:
            ops.append(dist.P2POp(dist.isend, send_next, rank + 1))
        if send_prev is not None and not first:
            ops.append(dist.P2POp(dist.isend, send_prev, rank - 1))
        if recv_prev and not first:
            act = torch.empty(micro_shape, dtype=torch.float64)
            ops.append(dist.P2POp(dist.irecv, act, rank - 1))
        if recv_next and not last:
            grad = torch.empty(micro_shape, dtype=torch.float64)
            ops.append(dist.P2POp(dist.irecv, grad, rank + 1))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return act, grad

    held = deque()  # (i, stage input, stage output) of the microbatches forwarded and not yet backwarded
    input_grads = [None] * n_micro

    def forward_step(i, a):
        with torch.profiler.record_function(f"F{i}"):
            a = (x.chunk(n_micro)[i].detach() if first else a).requires_grad_()
            y = forward(a, layers)
            if last:
                y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
        held.append((i, a, y))
        return y.detach()

    def backward_step(g):
        i, a, y = held.popleft()  # the oldest microbatch: its gradient is the one that comes back next
        with torch.profiler.record_function(f"B{i}"):
            y.backward(g)
        input_grads[i] = a.grad
        return a.grad

    warmup = min(world - 1 - rank, n_micro)
    a, _ = exchange(recv_prev=True)
    for i in range(warmup):
        y = forward_step(i, a)
        a, _ = exchange(send_next=y, recv_prev=i + 1 < n_micro)
    for i in range(warmup, n_micro):  # steady state: one forward, one backward
        y = forward_step(i, a)
        _, g = exchange(send_next=y, recv_next=True)
        dx = backward_step(g)
        a, _ = exchange(send_prev=dx, recv_prev=i + 1 < n_micro)
    for _ in range(warmup):  # cool-down: the backwards left over
        _, g = exchange(recv_next=True)
        dx = backward_step(g)
        exchange(send_prev=dx)
    return torch.cat(input_grads)
    # END SOLUTION
