"""p11, another style: the groups come from a grid of the ranks, `torch.arange(8).reshape(pp, dp, tp)`, created
pipeline groups first, then data-parallel, then tensor-parallel (every rank in the same order); sends and receives
name their peer by its rank inside the pipeline group (`group=pp, group_dst=`); f and g are plain functions around
one autograd Function; the gradients are averaged as one flat bucket per stage."""

import torch
import torch.nn.functional as F

from puzzles.model import loss_fn


def build_3d_groups(dist):
    grid = torch.arange(8).reshape(2, 2, 2)  # [pp, dp, tp]: tensor-parallel fastest
    me, mine = dist.get_rank(), {}
    for kind, lines in (("pp", grid.permute(1, 2, 0).reshape(-1, 2)), ("dp", grid.permute(0, 2, 1).reshape(-1, 2)),
                        ("tp", grid.reshape(-1, 2))):
        for line in lines:
            ranks = [int(r) for r in line]
            group = dist.new_group(ranks)
            if me in ranks:
                mine[kind] = group
    return mine["tp"], mine["dp"], mine["pp"]


class _Conjugate(torch.autograd.Function):
    """Identity one way, a sum over the group the other way."""

    @staticmethod
    def forward(ctx, t, dist, group, reduce_forward):
        ctx.dist, ctx.group, ctx.reduce_forward = dist, group, reduce_forward
        if reduce_forward:
            t = t.clone()
            dist.all_reduce(t, group=group)
        return t

    @staticmethod
    def backward(ctx, grad):
        if not ctx.reduce_forward:
            grad = grad.clone()
            ctx.dist.all_reduce(grad, group=ctx.group)
        return grad, None, None, None


class CopyToTPGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist, group):
        ctx.dist, ctx.group = dist, group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        ctx.dist.all_reduce(grad, group=ctx.group)
        return grad, None, None


class ReduceFromTPGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial, dist, group):
        return _Conjugate.forward(ctx, partial, dist, group, True)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def three_d_step(dist, groups, layers, x, target, n_micro, micro_shape):
    tp, dp, pp = groups
    stage, stages = dist.get_rank(pp), dist.get_world_size(pp)

    def f(t):
        return _Conjugate.apply(t, dist, tp, False)

    def g(t):
        return _Conjugate.apply(t, dist, tp, True)

    held, dx = [], []
    for i in range(n_micro):
        if stage == 0:
            a = x.chunk(n_micro)[i].detach().requires_grad_()
        else:
            a = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(a, group=pp, group_src=stage - 1)
            a.requires_grad_()
        y = a
        for w1, w2 in layers:
            y = y + g(F.gelu(f(y) @ w1) @ w2)
        if stage == stages - 1:
            y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
        else:
            dist.send(y.detach(), group=pp, group_dst=stage + 1)
        held.append((a, y))
    for i in reversed(range(n_micro)):
        a, y = held.pop()
        if stage == stages - 1:
            y.backward()
        else:
            g_out = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(g_out, group=pp, group_src=stage + 1)
            y.backward(g_out)
        if stage > 0:
            dist.send(a.grad, group=pp, group_dst=stage - 1)
        dx.insert(0, a.grad)
    weights = [w for pair in layers for w in pair]
    flat = torch.cat([w.grad.reshape(-1) for w in weights])
    dist.all_reduce(flat, group=dp)
    flat /= dist.get_world_size(dp)
    for w, part in zip(weights, flat.split([w.numel() for w in weights])):
        w.grad.copy_(part.view_as(w))
    return torch.cat(dx)
