"""p11, another style: 1F1B instead of GPipe (puzzle 6's schedule: p-1-stage warm-up forwards, then one forward
and one backward at a time, the oldest microbatch first), with each step's sends and receives posted together by
batch_isend_irecv on the pipeline group; the gradients averaged by reduce_scatter_tensor then
all_gather_into_tensor on the data-parallel group, one weight at a time."""

from collections import deque

import torch
import torch.nn.functional as F

from puzzles.model import loss_fn


def build_3d_groups(dist):
    tp_groups = [[0, 1], [2, 3], [4, 5], [6, 7]]
    dp_groups = [[0, 2], [1, 3], [4, 6], [5, 7]]
    pp_groups = [[0, 4], [1, 5], [2, 6], [3, 7]]
    made = [[dist.new_group(ranks) for ranks in kind] for kind in (tp_groups, dp_groups, pp_groups)]
    me = dist.get_rank()
    return tuple(next(g for g, ranks in zip(groups, kind) if me in ranks)
                 for groups, kind in zip(made, (tp_groups, dp_groups, pp_groups)))


class CopyToTPGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist, group):
        ctx.dist, ctx.group = dist, group
        return x

    @staticmethod
    def backward(ctx, grad):
        total = grad.clone()
        ctx.dist.all_reduce(total, group=ctx.group)
        return total, None, None


class ReduceFromTPGroup(torch.autograd.Function):
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

    def exchange(send_next=None, send_prev=None, recv_prev=False, recv_next=False):
        ops, act, grad = [], None, None
        if send_next is not None and not last:
            ops.append(dist.P2POp(dist.isend, send_next, peers[stage + 1], pp))
        if send_prev is not None and not first:
            ops.append(dist.P2POp(dist.isend, send_prev, peers[stage - 1], pp))
        if recv_prev and not first:
            act = torch.empty(micro_shape, dtype=torch.float64)
            ops.append(dist.P2POp(dist.irecv, act, peers[stage - 1], pp))
        if recv_next and not last:
            grad = torch.empty(micro_shape, dtype=torch.float64)
            ops.append(dist.P2POp(dist.irecv, grad, peers[stage + 1], pp))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return act, grad

    held, input_grads = deque(), [None] * n_micro

    def forward_step(i, a):
        a = (x.chunk(n_micro)[i].detach() if first else a).requires_grad_()
        y = a
        for w1, w2 in layers:
            y = y + ReduceFromTPGroup.apply(F.gelu(CopyToTPGroup.apply(y, dist, tp) @ w1) @ w2, dist, tp)
        if last:
            y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
        held.append((i, a, y))
        return y.detach()

    def backward_step(g):
        i, a, y = held.popleft()
        y.backward(g)
        input_grads[i] = a.grad
        return a.grad

    warmup = min(len(peers) - 1 - stage, n_micro)
    a, _ = exchange(recv_prev=True)
    for i in range(warmup):
        y = forward_step(i, a)
        a, _ = exchange(send_next=y, recv_prev=i + 1 < n_micro)
    for i in range(warmup, n_micro):
        y = forward_step(i, a)
        _, g = exchange(send_next=y, recv_next=True)
        dx = backward_step(g)
        a, _ = exchange(send_prev=dx, recv_prev=i + 1 < n_micro)
    for _ in range(warmup):
        _, g = exchange(recv_next=True)
        exchange(send_prev=backward_step(g))

    n = dist.get_world_size(dp)
    for w1, w2 in layers:
        for w in (w1, w2):
            flat = w.grad.reshape(-1)
            part = torch.empty(flat.numel() // n, dtype=flat.dtype)
            dist.reduce_scatter_tensor(part, flat, group=dp)
            part /= n
            dist.all_gather_into_tensor(flat, part, group=dp)
    return torch.cat(input_grads)
