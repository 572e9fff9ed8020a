"""p19 mistake (memory): a float64 vector of each element's weight in the norm (1, or 1/2 for a replicated one)
kept beside the master copy, m and v: four shard-sized float64 vectors between steps where the budget has three
and a byte (a bool mask fits; Python ranges cost nothing)."""

import torch

MISTAKE = "a float64 weight per shard element kept as state beside master, m and v"
EXPECTED_FAILURES = {"optimizer state"}
DIAGNOSIS = "a float64 mask or weight per element"


class ClippedShardedAdam:
    def __init__(self, dist, params, replicated, tp_group, dp_group, lr, betas, eps, max_norm):
        self.dist, self.params, self.dp_group = dist, params, dp_group
        self.lr, self.betas, self.eps, self.max_norm = lr, betas, eps, max_norm
        self.size, pair = dist.get_world_size(dp_group), dist.get_world_size(tp_group)
        self.shard = sum(p.numel() for p in params) // self.size
        lo = dist.get_rank(dp_group) * self.shard
        share = torch.cat([torch.full((p.numel(),), 1 / pair if rep else 1.0, dtype=torch.float64)
                           for p, rep in zip(params, replicated)])
        self.share = share[lo:lo + self.shard].clone()
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
            squares = (g * g * self.share).sum()
            self.dist.all_reduce(squares)
            norm = squares.sqrt()
            if not torch.isfinite(norm):
                return norm
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
