"""p19 mistake: no ZeRO: the gradients are all-reduced over the data-parallel pair and every rank keeps m and v
for all its parameters and updates them all (the global norm done right: each element counted once across the
pair's copies and the replicas). Same bytes as a reduce-scatter and an all-gather, twice the optimizer state."""

import torch

MISTAKE = "Adam's state replicated over the data-parallel pair (plain data parallel), not sharded (ZeRO-2)"
EXPECTED_FAILURES = {"optimizer state"}
DIAGNOSIS = "Adam is replicated over the data-parallel pair"


class ClippedShardedAdam:
    def __init__(self, dist, params, replicated, tp_group, dp_group, lr, betas, eps, max_norm):
        self.dist, self.params, self.replicated = dist, params, replicated
        self.tp_group, self.dp_group = tp_group, dp_group
        self.lr, self.betas, self.eps, self.max_norm = lr, betas, eps, max_norm
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    def step(self):
        beta1, beta2 = self.betas
        size, pair = self.dist.get_world_size(self.dp_group), self.dist.get_world_size(self.tp_group)
        with torch.no_grad():
            grads = torch.cat([p.grad.reshape(-1) for p in self.params])
            self.dist.all_reduce(grads, group=self.dp_group)
            grads /= size
            pieces = grads.split([p.numel() for p in self.params])
            squares = sum(g.pow(2).sum() / (pair if rep else 1) for g, rep in zip(pieces, self.replicated))
            self.dist.all_reduce(squares, group=self.tp_group)  # every replica holds all of it: no dp all-reduce
            norm = squares.sqrt()
            if not torch.isfinite(norm):
                return norm
            self.t += 1
            coef = torch.clamp(self.max_norm / (norm + 1e-6), max=1.0)
            for p, g, m, v in zip(self.params, pieces, self.m, self.v):
                g = g.view_as(p) * coef
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                p.addcdiv_(m, (v / (1 - beta2 ** self.t)).sqrt() + self.eps, value=-self.lr / (1 - beta1 ** self.t))
        return norm
