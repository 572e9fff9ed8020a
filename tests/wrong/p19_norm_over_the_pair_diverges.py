"""p19 mistake: the sum of squares all-reduced over the tensor-parallel pair only, not over the data-parallel
group too. Each pair's norm is its own shard's: the pair whose shards hold the NaN skips the step, the other pair
updates and goes on to the all-gather while its data-parallel partner is already at the next step's reduce-scatter."""

import torch

MISTAKE = "the sum of squares all-reduced over the tensor-parallel group only: data-parallel partners skip apart"
EXPECTED_STATUS = "error"
DIAGNOSIS = "summed over one group, not both"


class ClippedShardedAdam:
    def __init__(self, dist, params, replicated, tp_group, dp_group, lr, betas, eps, max_norm):
        self.dist, self.params = dist, list(params)
        self.tp_group, self.dp_group = tp_group, dp_group
        self.lr, (self.b1, self.b2), self.eps, self.max_norm = lr, betas, eps, max_norm
        self.D = dist.get_world_size(dp_group)
        self.T = dist.get_world_size(tp_group)
        self.dp = dist.get_rank(dp_group)
        total = sum(p.numel() for p in self.params)
        self.n = total // self.D
        lo, hi = self.dp * self.n, (self.dp + 1) * self.n
        mask = torch.zeros(self.n, dtype=torch.bool)
        off = 0
        for p, rep in zip(self.params, replicated):
            a, b = max(off, lo), min(off + p.numel(), hi)
            if rep and a < b:
                mask[a - lo:b - lo] = True
            off += p.numel()
        self.mask = mask
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in self.params])
            self.master = flat[lo:hi].clone()
            del flat
        self.m = torch.zeros(self.n, dtype=torch.float64)
        self.v = torch.zeros(self.n, dtype=torch.float64)
        self.t = 0

    @torch.no_grad()
    def step(self):
        dist = self.dist
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        g = torch.empty(self.n, dtype=torch.float64)
        dist.reduce_scatter_tensor(g, flat, group=self.dp_group)
        del flat
        g /= self.D
        sq = g * g
        sq = torch.where(self.mask, sq / self.T, sq)
        s = sq.sum().reshape(1)
        del sq
        dist.all_reduce(s, group=self.tp_group)  # the mistake: the tensor-parallel pair's sum only
        norm = s.sqrt()
        if not torch.isfinite(norm).all():
            return norm
        coef = (self.max_norm / (norm + 1e-6)).clamp(max=1.0)
        g *= coef
        self.t += 1
        self.m.lerp_(g, 1 - self.b1)
        self.v.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
        bc1 = 1 - self.b1 ** self.t
        bc2 = 1 - self.b2 ** self.t
        denom = (self.v.sqrt() / bc2 ** 0.5).add_(self.eps)
        self.master.addcdiv_(self.m, denom, value=-self.lr / bc1)
        del g, denom
        full = torch.empty(self.n * self.D, dtype=torch.float64)
        dist.all_gather_into_tensor(full, self.master, group=self.dp_group)
        off = 0
        for p in self.params:
            p.copy_(full[off:off + p.numel()].view_as(p))
            off += p.numel()
        del full
        return norm
