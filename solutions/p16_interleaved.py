"""Puzzle 16 — Interleaved 1F1B (virtual pipeline stages).

The task, and its budgets (p = 4 ranks, v = 2 chunks per rank, m = 8 microbatches):
  - bubble, the idle time over the work (Megatron-LM's measure), (makespan - W)/W: at most (p-1)/(v·m) + 1 point
    = 18.75% + 1 point = 19.8%, half of 1F1B's (p-1)/m = 37.5%;
  - activation memory on every rank at most the interleaved order's bound, (v·p + p - 1)·A_c + d·h·8 + A_c/2 =
    555,008 bytes: 11 chunk activations (1F1B holds 8 chunks' worth on rank 0, GPipe all 16);
  - point-to-point bytes: one microbatch's activation or gradient per chunk boundary crossed, each way (v times
    1F1B's on the middle ranks, 3 times on the end ones, whose 1F1B sends go one way only): 98,304 / 131,072 /
    131,072 / 98,304 bytes on ranks 0-3 (+ 1 KiB: at most 132,096).

In 1F1B (puzzle 6) rank r idles (p-1)·(F + BW) over a step, whatever m: the p-1 slots it waits while the pipeline
fills, and the p-1 it waits while it drains. Interleaving makes each slot smaller. Cut the model into v·p = 8
stages of one block and give each rank v = 2 of them, far apart: rank r holds stage r (its chunk 0) and stage
r + p (its chunk 1). A microbatch goes round the ranks twice: 0, 1, 2, 3, then 0, 1, 2, 3 again (rank 3 sends
chunk 0's output to rank 0, which runs its chunk 1 on it). A pipeline slot is now one chunk's work, (F + BW)/v,
so the bubble is (p-1)·(F + BW)/v: v times smaller, for the same work.

    time -->  (a-h: microbatches 0-7 through a rank's chunk 0 (stage r), A-H: through its chunk 1 (stage r + 4);
               one column, one chunk's forward (550 ticks); x==: its backward, about 2.7 columns; .: idle)
    rank 0  abcdABCDefg......A==hB==EC==FD==Ga==Hb==.c==.d==.E==.F==.G==.H==e==f==g==h==
    rank 1  .abcdABCDe....A==fB==gC==hD==Ea==Fb==Gc==Hd==.E==.F==.G==.H==e==f==g==h==...
    rank 2  ..abcdABC..A==DB==eC==fD==ga==hb==Ec==Fd==GE==HF==.G==.H==e==f==g==h==......
    rank 3  ...abcdAA==BB==CC==DD==ea==fb==gc==hd==EE==FF==GG==HH==e==f==g==h==.........

The order (Megatron-LM's): the microbatches go in groups of p = 4. A rank's forwards run a group through chunk 0,
then the same group through chunk 1, then the next group: a b c d A B C D e f g h E F G H. Its backwards go in
the same groups, the last chunk first (the gradient comes back from the end of the model): A B C D a b c d E F G
H e f g h. Rank r runs (p - r - 1)·2 + (v - 1)·p *warm-up* forwards (10, 8, 6, 4), then alternates one forward and
one backward, then runs the backwards left over. Rank 0 then holds at most 11 chunk activations at once, 5.5
stages' worth where 1F1B holds 4 (the interleaved bound: p·(1 + (p-1)/(p·v)) stages, Korthikanti et al. 2022);
running every forward first (GPipe over the chunks) would hold all 16.

The price is messages: every microbatch now crosses v·p - 1 = 7 stage boundaries each way, not p - 1 = 3. Each
rank sends one activation and one gradient per chunk per microbatch, v times 1F1B's, except at the two ends of
the model (stage 0 has no input to send a gradient to; the last stage's output is the loss): rank 0 sends 2m
activations and m gradients, ranks 1-2 2m of each, rank 3 m activations and 2m gradients, each one microbatch,
mb·d·8 = 4,096 bytes.

Write `interleaved_step(dist, chunks, x, target, n_micro, micro_shape)`, run by every rank:
  - `chunks`: this rank's v = 2 chunks, each a list of one block's (w1 [64, 256], w2 [256, 64]) with
    requires_grad: `chunks[0]` is stage r (block r), `chunks[1]` is stage r + p (block r + 4);
  - `x`: the batch, [64, 64], on rank 0 (None on the other ranks); `target`: [64, 64] on rank 3, whose chunk 1
    is the last stage (else None);
  - `n_micro`: m = 8; microbatch i is rows 8i to 8i+7 (`x.chunk(n_micro)[i]`, `target.chunk(n_micro)[i]`);
  - `micro_shape`: (8, 64), the shape of one microbatch's activations between stages and of their gradients.
  Chunk c's input comes from rank r - 1 (rank 3 for rank 0's chunk 1), its output goes to rank r + 1 (rank 0 for
  rank 3's chunk 0): stage s's neighbours are stages s - 1 and s + 1, on ranks (r - 1) % p and (r + 1) % p. Leave
  the gradient of the full-batch loss `loss_fn(forward(x, all 8 blocks), target)` in w.grad of both chunks'
  weights (they start as zeros), each microbatch's loss being `loss_fn(y, target_i) / n_micro`, and return
  `[dL/d(chunk 0's input), dL/d(chunk 1's input)]`, each for the whole batch ([64, 64], microbatch i in rows 8i to
  8i+7; rank 0's chunk 0 input is x).

The clock (puzzle 5's: the puzzles' GPU, messages free of latency at 4,096 bytes a tick): one chunk's forward of
one microbatch is F/v = 550 ticks (2 matmuls, a gelu, a residual add), its backward BW/v = 1,470 ticks, the last
stage's loss LF + LB = 75 ticks more, a message 1 tick.

Checks (sizes: p=4 ranks, v=2 chunks, m=8 microbatches, batch 64, d=64, h=256, 8 blocks, one per stage):
  - chunk gradients and input gradients: every w.grad and both returned input gradients equal the serial
    reference.
  - stage compute, every op counted: each chunk's block, each microbatch forward once and backward once, at most
    m·v·(F/v + BW/v) + m·(LF + LB) + m·mb·d = 25,800,848 FLOPs (F/v = 526,848, BW/v = 1,083,904: puzzle 6's F and BW
    cut in two), at least 25,165,824 of them in matmuls (m·v·6 of 2·8·64·256): no recomputation.
  - bubble: (makespan - W)/W, W = m·v·(F/v + BW/v) + m·(LF + LB) = 32,920 ticks the last rank's own work, at most
    (p-1)/(v·m) + 1 point = 19.8%, a makespan of 39,421 ticks (a perfect interleaved pipeline takes
    (v·m + p - 1)·(F + BW)/v + m·(LF + LB) = 38,980). 1F1B's (p-1)/m = 37.5% is far outside it; so is
    finishing each group of p microbatches before the next (the pipeline drains m/p times). Puzzle 6's measure,
    the idle share of the makespan, says the same: 3/19 = 15.8% against 1F1B's 3/11 = 27.3%. W counts as the last
    rank's own compute where that is less (a bubble is never below zero), and the bubble is read off the clock only
    once the clock holds the stages' work where the messages say it ran: every activation a rank sends on, and every
    gradient it sends back, needs its chunk's products (at least half of them) since its input arrived, and the step
    can be no shorter than the products of the critical path at the peak rate; a schedule the clock could not have
    run (work done in another thread, say) fails here.
  - activation memory: on every rank, the peak less its weights, their gradients, x or target and the two
    returned input gradients (2·2·d·h·8 + 2·2·d·h·8 + B·d·8 + 2·B·d·8 = 1,146,880 bytes on ranks 0 and 3,
    1,114,112 on ranks 1-2) is at most (v·p + p - 1)·A_c + d·h·8 + A_c/2 = 555,008 bytes. A_c = (2·8·h + 8·d)·8 =
    36,864 bytes is one microbatch's activations in one chunk (x@w1 and its gelu, [8, 256] each, and the block's
    output, [8, 64]); the interleaved order holds at most its warm-up and one more, v·p + p - 1 = 11 of them, on
    rank 0 (p·(1 + (p-1)/(p·v)) = 5.5 stages' worth, 1F1B 4, GPipe 8); d·h·8 = 131,072 bytes is a weight's fresh
    gradient before autograd adds it into w.grad; A_c/2 is slack for receive buffers and temporaries.
  - point-to-point bytes: every rank sends exactly the messages its chunks' boundaries take, 4,096 bytes each
    (98,304 / 131,072 / 131,072 / 98,304, + 1 KiB): nothing twice, no collective.
  - a deadlock is an error, reported with what each rank waits for.
  - keep everything as torch tensors (the grader refuses a tensor turned into a numpy array, a Python list or
    bytes, which its memory ledger could not see).

Hints:
  - Write the order as two lists first: the j-th forward is chunk (j // p) % v of microbatch (j // (p·v))·p + j % p;
    the j-th backward is the same microbatch in chunk v - 1 - (j // p) % v.
  - Send with isend and keep the handle: an activation's handle can be waited for once its gradient has come
    back (the next rank has surely received it by then); a gradient's at the end of the step.
  - `torch.profiler.record_function(f"F{i}.{c}")` / `(f"B{i}.{c}")` names a unit on the schedule chart
    (`python -m grader check puzzles -p p16 --schedule`).
"""

import torch

from puzzles.model import forward, loss_fn


def interleaved_step(dist, chunks, x, target, n_micro, micro_shape):
    # BEGIN SOLUTION
    rank, world = dist.get_rank(), dist.get_world_size()
    v = len(chunks)
    last_stage = v * world - 1
    units = n_micro * v  # forwards (and backwards) this rank runs: every microbatch through each of its chunks

    def forward_unit(j):
        """(chunk, microbatch) of the j-th forward: groups of `world` microbatches, chunk 0 then chunk 1."""
        group, k = divmod(j, world * v)
        return k // world, group * world + k % world

    def backward_unit(j):
        c, i = forward_unit(j)
        return v - 1 - c, i  # the same groups, the last chunk first

    held = {}  # (chunk, microbatch) -> (its input, its output): forwarded, not yet backwarded
    activation_sends = {}  # (chunk, microbatch) -> the isend of its output, until its gradient comes back
    gradient_sends = []
    input_grads = [[None] * n_micro for _ in range(v)]

    def run_forward(j):
        c, i = forward_unit(j)
        stage = c * world + rank
        with torch.profiler.record_function(f"F{i}.{c}"):
            if stage == 0:
                a = x.chunk(n_micro)[i].detach()
            else:
                a = torch.empty(micro_shape, dtype=torch.float64)
                dist.recv(a, src=(rank - 1) % world)
            a.requires_grad_()
            y = forward(a, chunks[c])
            if stage == last_stage:
                y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
            else:
                activation_sends[c, i] = dist.isend(y.detach(), (rank + 1) % world)
        held[c, i] = (a, y)

    def run_backward(j):
        c, i = backward_unit(j)
        stage = c * world + rank
        a, y = held.pop((c, i))
        with torch.profiler.record_function(f"B{i}.{c}"):
            if stage == last_stage:
                y.backward()
            else:
                g = torch.empty(micro_shape, dtype=torch.float64)
                dist.recv(g, src=(rank + 1) % world)
                activation_sends.pop((c, i)).wait()  # its gradient is back: the next rank had the activation
                y.backward(g)
            if stage > 0:
                gradient_sends.append(dist.isend(a.grad, (rank - 1) % world))
        input_grads[c][i] = a.grad

    warmup = min((world - rank - 1) * 2 + (v - 1) * world, units)
    for j in range(warmup):
        run_forward(j)
    for j in range(units - warmup):  # steady state: one forward, one backward
        run_forward(warmup + j)
        run_backward(j)
    for j in range(units - warmup, units):  # cool-down
        run_backward(j)
    for work in gradient_sends:
        work.wait()
    return [torch.cat(grads) for grads in input_grads]
    # END SOLUTION
