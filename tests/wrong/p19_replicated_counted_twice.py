"""p19 mistake: the global norm adds every rank's squares over the whole world, the replicated parameters (the
norms' scales and the biases) included on both ranks of the tensor-parallel pair: they count twice."""

import torch

MISTAKE = "the replicated parameters are counted once per rank that holds them (twice) in the global norm"
EXPECTED_FAILURES = {"weights after each step", "global norm"}
DIAGNOSIS = "were counted 2 times"


class ClippedShardedAdam:
    def __init__(self, dist, params, replicated, tp_group, dp_group, lr, betas, eps, max_norm):
        self.dist, self.params, self.group = dist, params, dp_group
        self.lr, self.betas, self.eps, self.max_norm = lr, betas, eps, max_norm
        self.size = dist.get_world_size(dp_group)
        self.shard = sum(p.numel() for p in params) // self.size
        lo = dist.get_rank(dp_group) * self.shard
        with torch.no_grad():
            self.master = torch.cat([p.reshape(-1) for p in params])[lo:lo + self.shard].clone()
        self.m, self.v, self.t = torch.zeros_like(self.master), torch.zeros_like(self.master), 0

    def step(self):
        beta1, beta2 = self.betas
        with torch.no_grad():
            g = torch.empty_like(self.master)
            self.dist.reduce_scatter_tensor(g, torch.cat([p.grad.reshape(-1) for p in self.params]), group=self.group)
            g /= self.size
            squares = (g * g).sum()
            self.dist.all_reduce(squares)  # every rank's shard, replicated copies and all
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
            self.dist.all_gather_into_tensor(flat, self.master, group=self.group)
            for p, piece in zip(self.params, flat.split([p.numel() for p in self.params])):
                p.copy_(piece.view_as(p))
        return norm
