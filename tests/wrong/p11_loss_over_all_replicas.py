"""p11 mistake: each microbatch's loss divided by the number of microbatches of the whole batch (m·D), as if
for the global mean, and the weight gradients still averaged over the replicas: every gradient is 1/D of the
serial one (exactly 0.5x here)."""

import torch
import torch.nn.functional as F

from puzzles.model import loss_fn

MISTAKE = "each microbatch's loss divided by m·D (the whole batch's microbatches) on top of the replicas' average"
EXPECTED_FAILURES = {"stage gradients", "input gradients"}
DIAGNOSIS = "the number of replicas for the whole batch's mean"


def build_3d_groups(dist):
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


class CopyToTPGroup(torch.autograd.Function):
    """f: identity forward, all-reduce over the tensor-parallel group backward."""

    @staticmethod
    def forward(ctx, x, dist, group):
        ctx.dist, ctx.group = dist, group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        ctx.dist.all_reduce(grad, group=ctx.group)
        return grad, None, None


class ReduceFromTPGroup(torch.autograd.Function):
    """g: all-reduce over the tensor-parallel group forward, identity backward."""

    @staticmethod
    def forward(ctx, partial, dist, group):
        total = partial.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def three_d_step(dist, groups, layers, x, target, n_micro, micro_shape):
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
                y = loss_fn(y, target.chunk(n_micro)[i]) / (n_micro * dist.get_world_size(dp))  # the global batch's mean?
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
