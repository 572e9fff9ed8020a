"""p19 mistake: the global norm is right, but each rank decides the skip from its own gradient shard (finite
here: skip nothing), so only the rank whose shard holds the NaN skips; the others clip by a NaN coefficient."""

import torch

MISTAKE = "each rank decides whether to skip from its own gradient shard, not from what every rank shares"
EXPECTED_FAILURES = {"weights after each step", "skipped steps"}
DIAGNOSIS = "a rank-local skip"


class ClippedShardedAdam:
    def __init__(self, dist, params, replicated, tp_group, dp_group, lr, betas, eps, max_norm):
        self.dist, self.params, self.tp_group, self.dp_group = dist, params, tp_group, dp_group
        self.lr, self.betas, self.eps, self.max_norm = lr, betas, eps, max_norm
        self.size = dist.get_world_size(dp_group)
        self.shard = sum(p.numel() for p in params) // self.size
        lo = dist.get_rank(dp_group) * self.shard
        weights = torch.cat([torch.full((p.numel(),), 0.5 if rep else 1.0, dtype=torch.float64)
                             for p, rep in zip(params, replicated)])
        self.weight = weights[lo:lo + self.shard] > 0.75  # True where the element is counted in full
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
            squares = torch.where(self.weight, g * g, g * g / 2).sum()
            self.dist.all_reduce(squares)
            norm = squares.sqrt()
            if torch.isfinite(g).all():  # this rank's own shard
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
