"""p19, another style: a bool mask of the shard's replicated elements (a byte each, within the budget), the squares
of those halved, one all-reduce over every rank, the norm handed back as a Python float; the skip and the
coefficient decided from that float."""

import math

import torch


class ClippedShardedAdam:
    def __init__(self, dist, params, replicated, tp_group, dp_group, lr, betas, eps, max_norm):
        self.dist, self.params, self.group = dist, params, dp_group
        self.hyper, self.max_norm, self.t = (lr, betas, eps), max_norm, 0
        self.parts, self.copies = dist.get_world_size(dp_group), dist.get_world_size(tp_group)
        n = sum(p.numel() for p in params)
        self.shard = n // self.parts
        lo = dist.get_rank(dp_group) * self.shard
        mask = torch.cat([torch.full((p.numel(),), bool(rep)) for p, rep in zip(params, replicated)])
        self.mask = mask[lo:lo + self.shard].clone()
        with torch.no_grad():
            self.master = torch.cat([p.detach().reshape(-1) for p in params])[lo:lo + self.shard].clone()
        self.m = torch.zeros_like(self.master)
        self.v = torch.zeros_like(self.master)

    def step(self):
        lr, (b1, b2), eps = self.hyper
        with torch.no_grad():
            g = torch.empty_like(self.master)
            self.dist.reduce_scatter_tensor(g, torch.cat([p.grad.reshape(-1) for p in self.params]), group=self.group)
            g.div_(self.parts)
            sq = g.pow(2)
            partial = sq.masked_fill(self.mask, 0).sum() + sq.masked_fill(~self.mask, 0).sum() / self.copies
            self.dist.all_reduce(partial)
            norm = math.sqrt(partial.item())
            if not math.isfinite(norm):
                return norm
            self.t += 1
            g.mul_(min(1.0, self.max_norm / (norm + 1e-6)))
            self.m.lerp_(g, 1 - b1)
            self.v.mul_(b2).addcmul_(g, g, value=1 - b2)
            step = lr / (1 - b1 ** self.t)
            self.master.addcdiv_(self.m, self.v.div(1 - b2 ** self.t).sqrt().add(eps), value=-step)
            gathered = [torch.empty_like(self.master) for _ in range(self.parts)]
            self.dist.all_gather(gathered, self.master, group=self.group)
            for p, piece in zip(self.params, torch.cat(gathered).split([p.numel() for p in self.params])):
                p.copy_(piece.view_as(p))
        return norm
