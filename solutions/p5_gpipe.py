"""Puzzle 5 — Pipeline parallel (GPipe).

The model is too deep for one device, so it is cut into p = 4 *stages* of consecutive blocks, one stage per rank:
rank 0 holds blocks 0-1, rank 1 blocks 2-3, and so on. Rank 0 holds the inputs x, the last rank the targets.
Activations travel forward from rank to rank with send/recv, and their gradients travel back the same way.

Run the whole batch through at once and only one rank is ever busy: the others wait, and with p stages each rank
idles (p-1)/p of the time (75% here). GPipe cuts the batch into m = 8 *microbatches* and streams them, so that
rank 1 works on microbatch 0 while rank 0 already works on microbatch 1. All forwards first, then all backwards:

    time -->  (Fi: microbatch i's forward through one stage, F; Bi===: its backward, BW, about 2.7F; .: idle)
    rank 0  F0F1F2F3F4F5F6F7.....................B7===B6===B5===B4===B3===B2===B1===B0===
    rank 1  ..F0F1F2F3F4F5F6F7..............B7===B6===B5===B4===B3===B2===B1===B0===.....
    rank 2  ....F0F1F2F3F4F5F6F7.......B7===B6===B5===B4===B3===B2===B1===B0===..........
    rank 3  ......F0F1F2F3F4F5F6F7B7===B6===B5===B4===B3===B2===B1===B0===...............

Each rank still idles while the pipeline fills and drains: p-1 of the m+p-1 slots of the forward pass, and again
of the backward pass, so the bubble is (p-1)/(m+p-1) = 3/11 = 27.3%: more microbatches, smaller bubble.

Write `gpipe_step(dist, layers, x, target, n_micro, micro_shape)`, run by every rank:
  - `layers`: this stage's 2 blocks, a list of (w1 [64, 256], w2 [256, 64]) pairs with requires_grad;
  - `x`: the batch, [64, 64], on rank 0 (None on the other ranks); `target`: [64, 64] on the last rank (else None);
  - `n_micro`: m = 8; microbatch i is rows 8i to 8i+7 (`x.chunk(n_micro)[i]`, `target.chunk(n_micro)[i]`);
  - `micro_shape`: (8, 64), the shape of one microbatch's activations between stages and of their gradients:
    allocate receive buffers with it (`torch.empty(micro_shape, dtype=torch.float64)`).
  Forward every microbatch (stage input -> `forward(a, layers)` from puzzles.model -> send it to rank + 1; on the
  last rank, `loss_fn(y, target_i) / n_micro`), then backward every microbatch (receive the gradient of the
  stage's output from rank + 1, backpropagate it, send the gradient of the stage's input to rank - 1). Leave the
  gradient of the full-batch loss `loss_fn(forward(x, all layers), target)` in `w.grad` of this stage's weights
  (they start as zeros; backward adds into them, so they accumulate over the microbatches), and return the
  gradient of the loss with respect to this stage's input for the whole batch ([64, 64], microbatch i in rows 8i
  to 8i+7). On rank 0 that is dL/dx, what a layer before the pipeline (an embedding, in a language model) would
  need; computing it also makes every stage's backward cost the same, BW.

The clock (README, "The clock"): the puzzles' GPU, where every op costs its roofline time, max(FLOPs / 1,024,
bytes / 2,048) + 4 ticks, and messages with no latency and 4,096 bytes a tick (CostModel(latency_ticks=0,
bytes_per_tick=4096)). One stage's forward of one microbatch is F = 1,100 ticks: 4 matmuls of 2·8·64·256 FLOPs
(260 ticks each), 2 gelus over [8, 256] (20 each) and 2 residual adds over [8, 64] (10 each), both bound by
memory. Its backward is BW = 2,940 ticks: 8 matmuls, the gelus' backward and the adds of input gradients, and the
4 weight gradients added into w.grad, 196 ticks each (reading two [64, 256] matrices and writing one takes as long
as a matmul of these sizes). The last stage's loss costs LF = 35 ticks forward and LB = 40 backward, and a message
of one microbatch's activations (8·64·8 = 4,096 bytes) 1 tick.

Checks (sizes: p=4 ranks, m=8 microbatches, batch 64, d=64, h=256, L=8 blocks, 2 per stage):
  - stage gradients: every rank's w.grad equal the serial full-batch gradients of its blocks.
  - input gradients: every rank returns dL/d(its stage input), equal to the serial reference.
  - stage compute, every op counted: each rank computes its own blocks only, each microbatch forward once and
    backward once, at most m·(F + BW + LF + LB) + m·mb·d = 25,800,848 FLOPs, where F = 1,053,696 FLOPs is one
    stage's forward of one microbatch (4 matmuls of 2·8·64·256, 2 gelus over 8·256, 2 adds over 8·64), BW =
    2,167,808 FLOPs its backward (8 matmuls, gelu's backward and the input gradients' adds, the 4 weight gradients
    accumulated into w.grad, 64·256 each), LF + LB = 3,090 FLOPs the last stage's loss, and m·mb·d = 4,096 room for
    bookkeeping. No recomputation, and no running another stage's blocks. And at least the stage's products,
    m·6·2·(2·8·64·256) = 25,165,824 FLOPs of matmuls: a product written as elementwise multiplies and sums costs as
    many FLOPs, none of them products, and four times the time.
  - bubble: 1 - W/makespan, where W = m·(F + BW + LF + LB) = 32,920 ticks is the last stage's own work (the
    busiest stage: it computes the loss too), at most (p-1)/(m+p-1) + 0.5 points = 27.3% + 0.5 points = 27.8%, a
    budget on the makespan of about 45,578 ticks. With free messages a perfect schedule takes exactly
    (m+p-1)·(F + BW) + m·(LF + LB) = 45,040 ticks (and 36 more to return dL/d(input)); here each message costs 1
    tick. The whole batch as one microbatch idles (p-1)/p = 75%. W counts as the last stage's own compute where
    that is less (a bubble is never below zero). And the bubble is read off the clock only once the clock holds the
    stages' work where the messages say it ran: every activation a stage sends on, and every gradient it sends back,
    needs its stage's products (at least half of them) since its input arrived, and the step can be no shorter than
    the products of the critical path at the peak rate; a schedule the clock could not have run (work done in
    another thread, say) fails here.
  - GPipe's order is the lesson, not a rule: any order of the forwards and backwards that meets these checks
    passes (puzzle 6's 1F1B does too).
  - a deadlock is an error, reported with what each rank waits for (a blocking send here waits for the matching
    recv, as a rendezvous).
  - keep everything as torch tensors (the grader refuses a tensor turned into a numpy array, a Python list or
    bytes, which its memory ledger could not see).

Hints:
  - The full-batch loss is the mean of the microbatch losses, so scale each microbatch's loss by 1/m.
  - A stage's input must require grad so that backward computes its gradient: `a.requires_grad_()`; afterwards
    the gradient is in `a.grad`. `y.backward(g)` backpropagates a received gradient g through the stage's output y.
  - Keep each microbatch's stage input and output until its backward; run the backwards in an order both
    neighbours agree on (the gradient you receive must go through the graph of the same microbatch).
  - `torch.profiler.record_function(f"F{i}")` / `(f"B{i}")` around a microbatch's work names it on the schedule chart.
"""

import torch

from puzzles.model import forward, loss_fn


def gpipe_step(dist, layers, x, target, n_micro, micro_shape):
    # BEGIN SOLUTION
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    inputs, outputs = [], []
    for i in range(n_micro):  # all forwards, microbatch 0 first
        with torch.profiler.record_function(f"F{i}"):
            if first:
                a = x.chunk(n_micro)[i].detach()
            else:
                a = torch.empty(micro_shape, dtype=torch.float64)
                dist.recv(a, src=rank - 1)
            a.requires_grad_()
            y = forward(a, layers)
            if last:
                y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
            else:
                dist.send(y.detach(), dst=rank + 1)
        inputs.append(a)
        outputs.append(y)
    input_grads = [None] * n_micro
    for i in reversed(range(n_micro)):  # all backwards, the newest microbatch first (every rank in the same order)
        with torch.profiler.record_function(f"B{i}"):
            if last:
                outputs[i].backward()
            else:
                g = torch.empty(micro_shape, dtype=torch.float64)
                dist.recv(g, src=rank + 1)
                outputs[i].backward(g)
            input_grads[i] = inputs[i].grad
            if not first:
                dist.send(input_grads[i], dst=rank - 1)
        inputs[i] = outputs[i] = None  # microbatch i's activations can go
    return torch.cat(input_grads)
    # END SOLUTION
