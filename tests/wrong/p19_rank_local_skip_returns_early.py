"""p19 mistake: each rank tests its own gradient shard and, finding a NaN, returns before the collectives the
other ranks go on to call: rank 3 leaves step 3 while its data-parallel partner waits in the all-reduce of the
norm. On a cluster this hangs; the simulator names it at once."""

import torch

MISTAKE = "a rank that finds a NaN in its own shard returns before the collectives the other ranks call"
EXPECTED_STATUS = "error"
DIAGNOSIS = "rank 3 returned early"


class ClippedShardedAdam:
    def __init__(self, dist, params, replicated, tp_group, dp_group, lr, betas, eps, max_norm):
        self.dist, self.params, self.tp_group, self.dp_group = dist, params, tp_group, dp_group
        self.lr, self.betas, self.eps, self.max_norm = lr, betas, eps, max_norm
        self.size, self.pair = dist.get_world_size(dp_group), dist.get_world_size(tp_group)
        self.shard = sum(p.numel() for p in params) // self.size
        lo = dist.get_rank(dp_group) * self.shard
        self.ranges, offset = [], 0
        for p, rep in zip(params, replicated):
            start, end = max(offset, lo), min(offset + p.numel(), lo + self.shard)
            if start < end:
                self.ranges.append((start - lo, end - lo, rep))
            offset += p.numel()
        with torch.no_grad():
            self.master = torch.cat([p.reshape(-1) for p in params])[lo:lo + self.shard].clone()
        self.m, self.v, self.t = torch.zeros_like(self.master), torch.zeros_like(self.master), 0

    def step(self):
        beta1, beta2 = self.betas
        with torch.no_grad():
            g = torch.empty_like(self.master)
            self.dist.reduce_scatter_tensor(g, torch.cat([p.grad.reshape(-1) for p in self.params]),
                                            group=self.dp_group)
            g /= self.size
            if not torch.isfinite(g).all():
                return float("nan")  # as on one GPU: skip, and say so
            squares = torch.zeros((), dtype=torch.float64)
            for a, b, rep in self.ranges:
                squares += g[a:b].pow(2).sum() / (self.pair if rep else 1)
            self.dist.all_reduce(squares)
            norm = squares.sqrt()
            self.t += 1
            g *= torch.clamp(self.max_norm / (norm + 1e-6), max=1.0)
            self.m.mul_(beta1).add_(g, alpha=1 - beta1)
            self.v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (self.v / (1 - beta2 ** self.t)).sqrt() + self.eps
            self.master.addcdiv_(self.m, denom, value=-self.lr / (1 - beta1 ** self.t))
            flat = torch.empty(self.shard * self.size, dtype=self.master.dtype)
            self.dist.all_gather_into_tensor(flat, self.master, group=self.dp_group)
            for p, piece in zip(self.params, flat.split([p.numel() for p in self.params])):
                p.copy_(piece.view_as(p))
        return norm
