"""Puzzle 10 — ZeRO-3 / FSDP: sharded weights, gathered just in time, with prefetch.

The task: write `fsdp_step`, one data-parallel SGD step in which no rank ever holds the whole model. Each rank
keeps 1/N of every layer's weights; a layer is all-gathered just before its forward and let go after it,
gathered again for its backward, and its gradient is reduce-scattered, so that each rank receives only its shard
of the gradient. The next layer's all-gather runs while the current layer computes.
The checks, with their numbers (sizes: N = 4 ranks, L = 4 blocks, batch 16 so b = 4 rows per rank, d=64, h=256;
one layer's weights W = 2·d·h·8 = 262,144 bytes, all of them 8Ψ = L·W = 1,048,576 bytes, Ψ = 131,072 weights):
  - weights after the step: every rank's shards equal its 1/N of one SGD step of the serial model on the whole
    batch.
  - gathered weights: at every collective call, the all-gathered buffers still alive plus your shards are at most
    8Ψ/N + 2·W + 1,024 = 787,456 bytes: your shards, the layer being computed and the one being prefetched.
  - forward memory: at every collective call of the forward (before the first gradient's reduce-scatter), the
    bytes the rank holds beyond its inputs are at most 2·W + (L + 2)·Act + 1,024 = 648,192 bytes, whatever
    tensors hold them (Act = b·(2d + 2h)·8 = 20,480 bytes, room for one block's activations and output: L blocks'
    worth, and two more for temporaries). One more layer's weights, W, would not fit.
  - compute, every op counted: each rank computes at most its share of the step, 3,402,496 FLOPs (the given
    helpers' forward and backward on its own rows, the loss's gradient, its shards' update, and room for one
    elementwise pass over the weights), and at least 3,014,656 FLOPs of matmuls (its own rows, nothing
    recomputed).
  - communication: each rank sends exactly the ZeRO-3 volume, 3·(N-1)/N·8Ψ = 2,359,296 bytes (at most
    2,360,320: 1 KiB of room for scalars): 1.5 x data parallel's 2·(N-1)/N·8Ψ = 1,572,864.
  - makespan: the communication left exposed, makespan - min(work, 1.25·C), at most 2·A + T = 714 ticks
    (C = 5,659 ticks of compute, A = 216 ticks for one layer's all-gather or reduce-scatter, T = 5% of C = 282;
    work is the busiest rank's compute stream, less what ran while a message was in flight without arithmetic
    to explain it: copies and clones then hide nothing).

From ZeRO-2 to ZeRO-3. ZeRO-2 (puzzle 8) shards the optimizer state and the gradients, but every rank still
holds every weight: the model must fit on one device. ZeRO-3 (Rajbhandari et al., 2020; PyTorch's FSDP) shards
the weights too. Rank r keeps shard r of each layer's flattened weights, 1/N of them; the full weights of a layer
exist only while that layer computes:

    shards (rank r)  layer 0: [r]   layer 1: [r]   layer 2: [r]   layer 3: [r]        8Ψ/N = 262,144 bytes
    forward          gather 0, compute 0, free 0; gather 1, compute 1, free 1; ... gather 3, compute 3, free 3
    backward         gather 3, backward 3, free 3, reduce-scatter grad 3; gather 2, ...; gather 0, ... rs 0
    update           each rank: shard r of layer i -= lr · (its reduce-scattered gradient shard) / N

Communication, per rank (ring algorithm; the ZeRO paper's accounting): each layer is all-gathered twice
(forward and backward) and its gradient reduce-scattered once, each (N-1)/N of the layer's bytes: 3·(N-1)/N·8Ψ
in all, 2,359,296 bytes. Data parallel's all-reduce sends 2·(N-1)/N·8Ψ = 1,572,864: ZeRO-3 costs 1.5 x the
communication of data parallel, and buys memory: 8Ψ/N of weights plus two layers, instead of 8Ψ.

Prefetch. A gather that starts only when its layer is needed stalls the compute stream for the whole gather. So
launch each gather one layer ahead, with async_op=True: while layer i computes, layer i+1's weights arrive. The
layers are used in the order 0, 1, 2, 3 (forward), 3, 2, 1, 0 (backward): eight gathers, each prefetched during
the compute before it. The reduce-scatters run asynchronously too, behind the next layer's backward:

    compute  |    |F0  |F1  |F2  |F3  |B3        |B2        |B1        |B0        |    |
    comm     |g0  |g1  |g2  |g3  |g3  |g2        |rs3 g1    |rs2 g0    |rs1       |rs0 |
              ^ the first gather: nothing to hide it behind      the last reduce-scatter: nothing either ^
    (gi: layer i's all-gather; rsi: its gradient's reduce-scatter; Fi, Bi: its forward and backward)

One layer's forward takes 283 ticks, its backward 699 (two matmuls of 2·b·d·h = 131,072 FLOPs, 132 ticks each,
and the elementwise work around them; the backward by hand below has a dozen elementwise ops); a gather (or a
reduce-scatter) of one layer's W = 262,144 bytes costs (N-1)·alpha + (N-1)/N·W/1024 = 216 ticks, less than a
forward, and a gather plus a reduce-scatter (432 ticks) less than a backward. So everything hides but the first
gather and the last reduce-scatter: 2·A = 432 ticks exposed, a makespan of C + 2·A = 5,659 + 432 = 6,091 ticks
(C, the compute: the forward 1,132, the backward 2,796, and 1,731 for the loss's gradient, each layer's gradients
copied into one flat buffer for its reduce-scatter, 260 ticks each, and the shards' update). Without prefetch
every gather waits, in the backward behind the reduce-scatter queued before it: 12·A = 2,592 ticks exposed.

Memory. At any moment a rank holds its shards (8Ψ/N), the layer it computes with, and the one being prefetched:
two layers' full weights, 2·W = 524,288 bytes, whatever L. (PyTorch's FSDP does the same with its "backward
prefetch" and a limit of in-flight all-gathers.) Keeping every gathered layer for the backward is ZeRO-2's
memory (all of 8Ψ) and data parallel's communication; the grader sees both.

The backward by hand. Autograd keeps what a matmul needs for its backward, the weights included: a graph built
in the forward would keep every gathered layer alive until the backward. So the blocks' forward and backward are
written out below (`forward_keeping_activations`, `backward_from_activations`): the forward keeps the
activations only (x and x @ w1, b·(d + h)·8 = 10,240 bytes a block), and the backward takes the weights again
from you. Use them as they are; `layer_weights(flat)` views a flat layer as its (w1, w2).

Write `fsdp_step(dist, shards, x, target, lr)`:
  - `shards`: this rank's shard of each layer, a list of L = 4 float64 tensors of 2·d·h/N = 8,192 numbers:
    shard r of the layer's flat weights `torch.cat([w1.reshape(-1), w2.reshape(-1)])` (elements 8,192·r to
    8,192·(r+1) - 1). `all_gather_into_tensor` of the N shards gives the flat layer back, in rank order.
  - `x`, `target`: this rank's b = 4 rows of the batch, [4, 64] each. The loss is `loss_fn` over the whole batch
    (squared error summed over features, averaged over all 16 rows), so the full-batch gradient is the average of
    the ranks' gradients of their own `loss_fn(y, target)`; that one's gradient with respect to y is
    2·(y - target)/b.
  - Run the forward layer by layer, the backward layer by layer in reverse, reduce-scatter each layer's flat
    gradient (`reduce_scatter_tensor` sums: divide by N), and update the shards in place: shard -= lr · gradient
    shard. lr = 0.05. Return nothing.

The simulated machine: the puzzles' GPU (README, "The clock": every op costs max(FLOPs / 1,024, bytes / 2,048)
+ 4 ticks); latency alpha = 8 ticks per ring step, 1,024 bytes per tick; an all-gather or reduce-scatter of n
bytes (the full buffer) costs (N-1)·alpha + (N-1)/N·n/1024 ticks. Collectives run one at a time on the
communication queue, in the order the rank issued them, beside the compute stream; `wait()` joins them.

Checks, in detail:
  - weights after the step: every rank's 4 shards against the serial SGD step (float64, tolerance 1e-8).
  - gathered weights: the grader's `dist` notes the output of every all-gather you launch; at each collective it
    counts those buffers still alive (each storage once, whatever views of it you hold) and adds your shards.
    Let a layer's buffer go (del, or rebind every name that holds it) as soon as its compute is done.
  - forward memory: read off the ledger at each collective before the first reduce-scatter (or all-reduce) of a
    layer's gradient (at least W bytes; a smaller one does not end the forward): copies of the weights count,
    whatever made them.
  - compute: every op counted (the backward of block 0 may skip its input gradient). Copies of the gathered
    weights (a list all-gather and a torch.cat, a .clone()) cost no FLOPs but their memory traffic on the clock.
  - communication: the bytes each rank sends, summed over every collective: fewer means a gather was skipped
    (weights kept from the forward: ZeRO-2), more means more was sent (an all-reduce of the gradients).
  - makespan: prefetch is what makes it; the clock's rules are above. Compute beyond 1.25·C = 7,073 ticks (8
    copies of a gathered layer would take it there) hides no communication.
  - keep everything as torch tensors (the grader refuses a tensor turned into a numpy array, a Python list or
    bytes, which its memory ledger could not see).

Hints:
  - `work = dist.all_gather_into_tensor(full, shards[i], async_op=True)` starts a gather; `work.wait()` before
    using `full`. Launch the next layer's gather right after waiting for the current one, before computing.
  - Two buffers used in turn (`buffers[j % 2]` for the j-th gather) hold exactly two layers.
  - Keep a reduce-scatter's input and output alive until you have waited for it; update that shard then.
"""

import torch
import torch.nn.functional as F


def layer_weights(flat):
    """A flat layer (2·d·h numbers: w1 then w2, row-major) as views (w1 [64, 256], w2 [256, 64])."""
    d, h = 64, 256
    return flat[:d * h].view(d, h), flat[d * h:].view(h, d)


def forward_keeping_activations(x, w1, w2):
    """One block, x + gelu(x @ w1) @ w2, and what its backward needs: (x, x @ w1). Not the weights."""
    a = x @ w1
    return x + F.gelu(a) @ w2, (x, a)


def backward_from_activations(saved, w1, w2, grad_y):
    """The block's backward from what the forward kept and the weights: (grad_x, grad_w1, grad_w2)."""
    x, a = saved
    cdf = 0.5 * (1 + torch.erf(a * 0.5 ** 0.5))  # gelu(a) = a·cdf(a); gelu'(a) = cdf(a) + a·pdf(a)
    pdf = torch.exp(-0.5 * a * a) * (2 * torch.pi) ** -0.5
    grad_w2 = (a * cdf).T @ grad_y
    grad_a = (grad_y @ w2.T) * (cdf + a * pdf)
    grad_w1 = x.T @ grad_a
    grad_x = grad_y + grad_a @ w1.T
    return grad_x, grad_w1, grad_w2


def fsdp_step(dist, shards, x, target, lr):
    # BEGIN SOLUTION
    world, n_layers = dist.get_world_size(), len(shards)
    order = [*range(n_layers), *reversed(range(n_layers))]  # the layers in the order they are used
    buffers = [torch.empty(world * shards[0].numel(), dtype=shards[0].dtype) for _ in range(2)]
    saved = []  # what each layer's forward kept for its backward

    def gather(j):
        """Launch the all-gather of the j-th layer used, into buffer j % 2 (the other one is being computed with)."""
        return dist.all_gather_into_tensor(buffers[j % 2], shards[order[j]], async_op=True)

    # Wait for layer i's reduce-scatter (flat_grad, its input, lives until then), then update its shard.
    def finish(i, grad_shard, flat_grad, work):
        work.wait()
        shards[i] -= lr / world * grad_shard

    pending = gather(0)
    for j in range(n_layers):  # forward
        pending.wait()
        pending = gather(j + 1)  # the next layer arrives while this one computes
        x, kept = forward_keeping_activations(x, *layer_weights(buffers[j % 2]))
        saved.append(kept)
    grad = 2 * (x - target) / x.shape[0]  # d loss / d y for this rank's rows
    reducing = None
    for j, i in enumerate(order[n_layers:], start=n_layers):  # backward, the last layer first
        pending.wait()
        if j + 1 < 2 * n_layers:
            pending = gather(j + 1)
        grad, grad_w1, grad_w2 = backward_from_activations(saved.pop(), *layer_weights(buffers[j % 2]), grad)
        flat_grad = torch.cat([grad_w1.reshape(-1), grad_w2.reshape(-1)])
        del grad_w1, grad_w2
        if reducing is not None:
            finish(*reducing)
        grad_shard = torch.empty_like(shards[i])
        reducing = (i, grad_shard, flat_grad, dist.reduce_scatter_tensor(grad_shard, flat_grad, async_op=True))
    finish(*reducing)
    # END SOLUTION
