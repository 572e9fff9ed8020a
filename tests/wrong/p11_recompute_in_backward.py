"""p11 mistake: the forwards run under no_grad, keeping only each microbatch's stage input, and the backward runs
the stage forward again to get a graph (activation checkpointing, puzzle 1's trick, where this puzzle does not ask
for it). The values are right and the memory is lower, but every rank computes 4F per microbatch instead of 3F,
all-reduces each forward's activations twice, and the pipeline takes longer."""

import torch
import torch.nn.functional as F

from puzzles.model import loss_fn

MISTAKE = "recomputation: each microbatch's stage forward runs twice"
EXPECTED_FAILURES = {"compute", "bubble", "tensor-parallel communication"}
DIAGNOSIS = "recomputation"


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
            with torch.no_grad():  # the mistake: no graph now, a second forward in backward
                y = stage_forward(a)
            if not last:
                dist.send(y, dst=peers[stage + 1])
        inputs.append(a)
        outputs.append(y)
    input_grads = [None] * n_micro
    for i in reversed(range(n_micro)):  # all backwards, newest first on every stage
        with torch.profiler.record_function(f"B{i}"):
            inputs[i].requires_grad_()
            outputs[i] = stage_forward(inputs[i])
            if last:
                outputs[i] = loss_fn(outputs[i], target.chunk(n_micro)[i]) / n_micro
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
