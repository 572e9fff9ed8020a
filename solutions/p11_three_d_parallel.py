"""Puzzle 11 — 3-D parallelism: data × pipeline × tensor.

The task: one training step of a 4-block model on 8 ranks that use all three parallelisms at once, 2 data-parallel
replicas × 2 pipeline stages × 2 tensor-parallel ranks. You build the process groups yourself with
`dist.new_group`; then each rank runs GPipe over m = 4 microbatches with its neighbouring stage, the Megatron MLP of
puzzle 4 inside its tensor-parallel group, and averages its gradients with its data-parallel replica.

The budgets, per rank (derived below; W = 2,097,152 bytes is the whole model's weights):
  - weights 1/(p·t) of the model, W/(p·t) = 524,288 bytes: peak memory at most 1,626,112 bytes;
  - compute, every op counted: its slices' share of the step, at most 6,646,824 FLOPs, at least 6,291,456 of matmuls;
  - bubble of GPipe with p = 2 stages and m = 4 microbatches: (p-1)/(m+p-1) = 1/5 = 20.0%, + 1 point = 21.0%;
  - every collective on the rank's tensor-parallel or data-parallel group, every send to its neighbouring stage:
    at most 33,792 bytes sent on the tensor-parallel group, at most 525,312 bytes on the data-parallel group.

The layout (Megatron-LM's order: tensor-parallel fastest, then data-parallel, then pipeline):

    rank = tp + 2·dp + 4·pp           pp: the stage, dp: the replica, tp: the rank inside the tensor-parallel pair

                  replica 0 (rows 0-15)         replica 1 (rows 16-31)
    stage 0     [ rank 0 | rank 1 ]            [ rank 2 | rank 3 ]      blocks 0-1, hidden columns 0-255 | 256-511
                     |        |                     |        |           send/recv of [4, 64] activations
    stage 1     [ rank 4 | rank 5 ]            [ rank 6 | rank 7 ]      blocks 2-3, hidden columns 0-255 | 256-511

    tensor-parallel groups  [0, 1] [2, 3] [4, 5] [6, 7]    two all-reduces of [4, 64] per block per microbatch
    data-parallel groups    [0, 2] [1, 3] [4, 6] [5, 7]    one all-reduce of the rank's gradients per step
    pipeline groups         [0, 4] [1, 5] [2, 6] [3, 7]    send/recv between neighbouring stages

Rank 5, say, is (pp 1, dp 0, tp 1): it holds w1[:, 256:512] and w2[256:512, :] of blocks 2 and 3, works on replica
0's rows, all-reduces activations with rank 4, receives its activations from rank 1 (stage 0 of the same replica
and the same columns) and averages its gradients with rank 7 (the same weights, the other replica's rows).
Tensor-parallel ranks come first because their group talks the most: two all-reduces per block, every microbatch,
on the critical path; in a cluster they share a node and its fast links. The gradients' all-reduce comes once per
step, and the pipeline sends only one small activation per microbatch, so those groups can span nodes.

Groups: `dist.new_group(ranks)` is itself a collective of the whole world. Every rank must call it for every group,
the ones it is not in included, with the same ranks in the same order on every rank (torch.distributed requires
it: a rank that skips a call, or calls them in another order, leaves the others waiting or pairs the wrong groups).
A rank gets a group back from the calls it is a member of, and GroupMember.NON_GROUP_MEMBER from the others. Pass
the group to each collective (`dist.all_reduce(t, group=group)`); `dist.get_rank(group)`,
`dist.get_world_size(group)` and `dist.get_process_group_ranks(group)` (global ranks, in order) say where a rank
sits in it. send and recv take global
ranks (`dst=`, `src=`), with or without `group=`.

Write four things:
  - `build_3d_groups(dist) -> (tp_group, dp_group, pp_group)`: create every group of the layout above, and return
    the three this rank belongs to.
  - `CopyToTPGroup` (f) and `ReduceFromTPGroup` (g): puzzle 4's operators, on a group: `CopyToTPGroup.apply(x,
    dist, group)` returns x and all-reduces the gradient over `group` in backward; `ReduceFromTPGroup.apply(partial,
    dist, group)` returns the sum over `group` of every rank's `partial` and passes the gradient through.
  - `three_d_step(dist, groups, layers, x, target, n_micro, micro_shape)`, run by every rank, with the groups your
    build_3d_groups returned:
      - `layers`: this rank's slices of its stage's 2 blocks, a list of (w1_r [64, 256], w2_r [256, 64]) pairs with
        requires_grad, their .grad zeros; every block is `a = a + g(gelu(f(a) @ w1_r) @ w2_r)`;
      - `x`: this replica's 16 rows of the batch, [16, 64], on stage 0 (None on stage 1); `target`: its 16 rows of
        the targets on stage 1 (None on stage 0);
      - `n_micro`: m = 4; microbatch i is rows 4i to 4i+3 (`x.chunk(n_micro)[i]`); `micro_shape`: (4, 64), the shape
        of what goes between the stages (allocate receive buffers with it, dtype torch.float64);
      - run GPipe as in puzzle 5: all forwards, each stage input received from (and each stage output sent to) the
        neighbouring stage of the same replica and columns; on stage 1, each microbatch's loss is
        `loss_fn(y, target.chunk(n_micro)[i]) / n_micro` (so the replica's loss is loss_fn over its 16 rows); then
        all backwards, gradients sent back the same way;
      - then average every weight's gradient across the data-parallel group: after the step, each rank's w.grad is
        its slice of the gradient of the full-batch loss `loss_fn(forward(x, all layers), target)` (the mean of
        the two replicas' losses);
      - return the gradient of the replica's loss with respect to this stage's input, [16, 64] (microbatch i in
        rows 4i to 4i+3): on stage 0 that is d(replica loss)/dx. Both ranks of a tensor-parallel pair return it.

Why the three fit together: the tensor-parallel pair holds one block's weights between them and acts as one device
(f and g make every rank of the pair hold the whole activation between blocks, so the pipeline can send it from
either; each rank sends its own copy to the rank with its own columns on the next stage). Each pipeline of two
pairs is one replica, and the replica's gradients are averaged across data-parallel ranks holding the same slice.

The clock: the puzzles' GPU (README, "The clock"), CostModel(latency_ticks=0, bytes_per_tick=4096). One
microbatch's forward through a stage, on one rank, is F = 566 ticks (2 blocks, each 2 matmuls of 2·4·64·256 =
131,072 FLOPs, 132 ticks each, a gelu over [4, 256] and the residual add over [4, 64]), its backward BW = 1,886
ticks (the weight gradients added into w.grad, 100 ticks each, among them), the last stage's loss LF + LB = 63
ticks more; a [4, 64] activation (2,048 bytes) costs 1 tick to send and 1 tick to all-reduce over a pair; the
gradients' all-reduce (524,288 bytes) 128 ticks.

Checks (sizes: 8 ranks = D 2 × p 2 × t 2; batch B = 32, 16 rows per replica, m = 4 microbatches of 4 rows; d = 64,
h = 512, 256 columns per tensor-parallel rank; L = 4 blocks, 2 per stage):
  - stage gradients: every rank's w.grad equal its slice of the serial full-batch gradient of its blocks.
  - input gradients: every rank returns d(replica loss)/d(stage input), equal to the serial reference.
  - process groups: build_3d_groups returns, on every rank, its tensor-parallel, data-parallel and pipeline group of
    the layout above; every collective a rank runs is on its tensor-parallel or its data-parallel group (not the
    default group of all 8 ranks, not its pipeline group); every send goes to the neighbouring stage of the same
    replica and the same columns (rank 0 to rank 4, rank 5 to rank 1, ...). Barriers move no data and are free.
  - tensor-parallel communication: the bytes a rank sends on its tensor-parallel group (ring algorithm), at most
    one all-reduce of a [4, 64] activation per block per microbatch each way (g forward, f backward),
    2·m·(L/p)·2(t-1)/t·mb·d·8 + 1 KiB = 32,768 + 1,024 = 33,792 bytes.
  - data-parallel communication: the bytes a rank sends on its data-parallel group, at most one all-reduce of its
    gradients, 2(D-1)/D·W/(p·t) + 1 KiB = 524,288 + 1,024 = 525,312 bytes (one all-reduce per gradient, flat
    buckets, or reduce-scatter then all-gather all fit).
  - peak memory: each rank's peak at most 2·W/(p·t) + 2·b·d·8 + max(m·A + d·(h/t)·8, W/(p·t)) + A = 1,626,112
    bytes: its weights and their gradients (W/(p·t) = 524,288 bytes each), x or target and the returned gradient
    ([16, 64] each), then the larger of what the pipeline holds and what the gradients' all-reduce may need: GPipe
    holds the saved activations of all m microbatches (A = 2·(2·4·256 + 4·64)·8 = 36,864 bytes per microbatch: per
    block x@w1_r and its gelu, [4, 256] each, and the block's output, [4, 64]) and one weight's fresh gradient
    before autograd adds it into w.grad (d·(h/t)·8 = 131,072 bytes), 278,528 bytes; a flat bucket of the gradients
    for one all-reduce is W/(p·t) = 524,288 bytes; and A of slack. A rank that holds its stage's full weights (its
    partner's slices too, and their gradients) cannot fit.
  - compute, every op counted: each rank computes its stage's blocks with its own slices, each microbatch forward
    once and backward once, at most m·(F + BW + LF + LB) + Ψ/(p·t) + m·mb·d = 6,646,824 FLOPs (F = 526,848 FLOPs,
    BW = 1,116,672, the last stage's loss LF + LB = 1,546; room for one elementwise pass over the rank's
    gradients, dividing them by D, and over each microbatch's gradient): no full weights, no recomputation. And at
    least its products, 12·B·d·h·L/8 = 6,291,456 FLOPs of matmuls, its 1/8 of the serial step's: a product
    written as elementwise multiplies and sums costs as many FLOPs, none of them products.
  - bubble: 1 - W/T_pipe, where W = m·(F + BW + LF + LB) = 10,060 ticks is the last (busiest) stage's own work
    and T_pipe is when the last backward ends on any rank (the gradients' all-reduce that follows is data
    parallelism's cost, not the pipeline's), at most GPipe's (p-1)/(m+p-1) = 1/5 = 20.0% plus 1 point, 21.0%.
    With free messages a perfect 2-stage pipeline of 4 microbatches takes (m+p-1)·(F + BW) + m·(LF + LB) = 12,512
    ticks; here the 1-tick all-reduces and sends add a few, and so do the copies f and g may make of a [4, 64]
    activation (6 ticks each). GPipe's order is the lesson, not a rule: 1F1B (puzzle 6) has the same bubble and
    passes too. As in puzzle 5, W counts as the last stage's own compute where that is less (never below zero),
    and the bubble is read only once the clock holds each stage's work between the messages that need it (each
    activation sent on, each gradient sent back, after its products since its input arrived) and the step is no
    shorter than the critical path's products at the peak rate.
  - a deadlock, or ranks that meet in new_group or a collective with different arguments, is an error.
  - keep everything as torch tensors (the grader refuses a tensor turned into a numpy array, a Python list or
    bytes, which its memory ledger could not see).

Hints:
  - Build the groups with three loops over the layout, the same on every rank, keeping the group of each loop that
    contains `dist.get_rank()`: tensor-parallel groups [tp + 2·dp + 4·pp for tp in 0, 1] for each (pp, dp), ...
  - Your neighbours in the pipeline: `peers = dist.get_process_group_ranks(pp_group)`, `stage =
    dist.get_rank(pp_group)`; send to peers[stage + 1], receive from peers[stage - 1].
  - The all-reduce of the gradients sums: divide by `dist.get_world_size(dp_group)` (the loss is a mean over rows).
"""

import torch
import torch.nn.functional as F

from puzzles.model import loss_fn


def build_3d_groups(dist):
    # BEGIN SOLUTION
    T = D = P = 2

    def at(pp, dp, tp):  # the layout: tensor-parallel fastest, then data-parallel, then pipeline
        return tp + T * dp + T * D * pp

    layouts = {  # every group of each kind, in the same order on every rank
        "tp": [[at(pp, dp, tp) for tp in range(T)] for pp in range(P) for dp in range(D)],
        "dp": [[at(pp, dp, tp) for dp in range(D)] for pp in range(P) for tp in range(T)],
        "pp": [[at(pp, dp, tp) for pp in range(P)] for dp in range(D) for tp in range(T)],
    }
    rank, mine = dist.get_rank(), {}
    for kind, groups in layouts.items():
        for ranks in groups:
            group = dist.new_group(ranks)  # every rank calls it, member or not
            if rank in ranks:
                mine[kind] = group
    return mine["tp"], mine["dp"], mine["pp"]
    # END SOLUTION


class CopyToTPGroup(torch.autograd.Function):
    """f: identity forward, all-reduce over the tensor-parallel group backward."""

    @staticmethod
    def forward(ctx, x, dist, group):
        # BEGIN SOLUTION
        ctx.dist, ctx.group = dist, group
        return x
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        # BEGIN SOLUTION
        grad = grad.clone()
        ctx.dist.all_reduce(grad, group=ctx.group)
        return grad, None, None
        # END SOLUTION


class ReduceFromTPGroup(torch.autograd.Function):
    """g: all-reduce over the tensor-parallel group forward, identity backward."""

    @staticmethod
    def forward(ctx, partial, dist, group):
        # BEGIN SOLUTION
        total = partial.clone()
        dist.all_reduce(total, group=group)
        return total
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        # BEGIN SOLUTION
        return grad, None, None
        # END SOLUTION


def three_d_step(dist, groups, layers, x, target, n_micro, micro_shape):
    # BEGIN SOLUTION
    tp, dp, pp = groups
    stage, peers = dist.get_rank(pp), dist.get_process_group_ranks(pp)
    first, last = stage == 0, stage == len(peers) - 1

    def stage_forward(a):
        for w1, w2 in layers:
            a = a + ReduceFromTPGroup.apply(F.gelu(CopyToTPGroup.apply(a, dist, tp) @ w1) @ w2, dist, tp)
        return a

    inputs, outputs = [], []
    for i in range(n_micro):  # all forwards
        with torch.profiler.record_function(f"F{i}"):
            if first:
                a = x.chunk(n_micro)[i].detach()
            else:
                a = torch.empty(micro_shape, dtype=torch.float64)
                dist.recv(a, src=peers[stage - 1])
            a.requires_grad_()
            y = stage_forward(a)
            if last:
                y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
            else:
                dist.send(y.detach(), dst=peers[stage + 1])
        inputs.append(a)
        outputs.append(y)
    input_grads = [None] * n_micro
    for i in reversed(range(n_micro)):  # all backwards, newest first on every stage
        with torch.profiler.record_function(f"B{i}"):
            if last:
                outputs[i].backward()
            else:
                g = torch.empty(micro_shape, dtype=torch.float64)
                dist.recv(g, src=peers[stage + 1])
                outputs[i].backward(g)
            input_grads[i] = inputs[i].grad
            if not first:
                dist.send(input_grads[i], dst=peers[stage - 1])
        inputs[i] = outputs[i] = None
    replicas = dist.get_world_size(dp)
    for w1, w2 in layers:  # the replica's gradients, averaged with the other replica's
        for w in (w1, w2):
            dist.all_reduce(w.grad, group=dp)
            w.grad /= replicas
    return torch.cat(input_grads)
    # END SOLUTION
