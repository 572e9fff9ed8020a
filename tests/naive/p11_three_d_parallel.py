"""Naive p11: data × pipeline parallel with tensor parallelism replaced by gathering. Each rank all-gathers its
stage's full weights from its tensor-parallel partner and runs the serial blocks, so both ranks of a pair compute
the same thing; the gradient of each gathered weight is cut back to the rank's slice. The groups, the pipeline and
the data-parallel average are right, and so are the values, but every rank holds its whole stage (1/p of the model,
not 1/(p·t)) and computes twice its share, which makes the pipeline twice as long."""

import torch
import torch.nn.functional as F

from puzzles.model import loss_fn

EXPECTED_FAILURES = {"tensor-parallel communication", "peak memory", "compute", "bubble"}
DIAGNOSIS = "more than its 1/(p·t) of the weights"


def build_3d_groups(dist):
    def at(pp, dp, tp):
        return tp + 2 * dp + 4 * pp

    layouts = {"tp": [[at(pp, dp, t) for t in range(2)] for pp in range(2) for dp in range(2)],
               "dp": [[at(pp, d, tp) for d in range(2)] for pp in range(2) for tp in range(2)],
               "pp": [[at(s, dp, tp) for s in range(2)] for dp in range(2) for tp in range(2)]}
    mine = {}
    for kind, groups in layouts.items():
        for ranks in groups:
            group = dist.new_group(ranks)
            if dist.get_rank() in ranks:
                mine[kind] = group
    return mine["tp"], mine["dp"], mine["pp"]


class GatherSlices(torch.autograd.Function):
    """Forward: the full weight, the pair's slices concatenated along `dim`. Backward: this rank's slice."""

    @staticmethod
    def forward(ctx, piece, dist, group, dim):
        ctx.index, ctx.dim, ctx.size = dist.get_rank(group), dim, piece.shape[dim]
        parts = [torch.empty_like(piece) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, piece.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        return grad.narrow(ctx.dim, ctx.index * ctx.size, ctx.size), None, None, None


class CopyToTPGroup(torch.autograd.Function):  # unused by this answer
    @staticmethod
    def forward(ctx, x, dist, group):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class ReduceFromTPGroup(torch.autograd.Function):  # unused by this answer
    @staticmethod
    def forward(ctx, partial, dist, group):
        return partial

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def three_d_step(dist, groups, layers, x, target, n_micro, micro_shape):
    tp, dp, pp = groups
    stage, peers = dist.get_rank(pp), dist.get_process_group_ranks(pp)
    first, last = stage == 0, stage == len(peers) - 1

    def stage_forward(a):
        for w1_r, w2_r in layers:
            w1, w2 = GatherSlices.apply(w1_r, dist, tp, 1), GatherSlices.apply(w2_r, dist, tp, 0)
            a = a + F.gelu(a @ w1) @ w2
        return a

    inputs, outputs = [], []
    for i in range(n_micro):
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
    for i in reversed(range(n_micro)):
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
    for w1, w2 in layers:
        for w in (w1, w2):
            dist.all_reduce(w.grad, group=dp)
            w.grad /= dist.get_world_size(dp)
    return torch.cat(input_grads)
