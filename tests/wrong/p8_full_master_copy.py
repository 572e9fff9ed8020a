"""p8 mistake: m and v are sharded, but the master copy is of all the weights (the whole flat vector), updated
where this rank's shard lies: a full-size float64 vector kept for no use."""

import torch

MISTAKE = "the master copy holds all the weights, not this rank's shard"
EXPECTED_FAILURES = {"optimizer state"}
DIAGNOSIS = "one full-size float64 vector"


class ShardedAdam:
    def __init__(self, dist, layers, lr, betas, eps):
        self.dist, self.lr, self.betas, self.eps = dist, lr, betas, eps
        self.weights = [w for pair in layers for w in pair]
        self.numel = sum(w.numel() for w in self.weights)
        self.shard = self.numel // dist.get_world_size()
        self.lo = dist.get_rank() * self.shard
        with torch.no_grad():
            self.master = torch.cat([w.reshape(-1) for w in self.weights])  # all of it
        self.m = torch.zeros(self.shard, dtype=torch.float64)
        self.v = torch.zeros(self.shard, dtype=torch.float64)
        self.t = 0

    def step(self):
        dist = self.dist
        beta1, beta2 = self.betas
        self.t += 1
        with torch.no_grad():
            flat_grad = torch.cat([w.grad.reshape(-1) for w in self.weights])
            g = torch.empty(self.shard, dtype=torch.float64)
            dist.reduce_scatter_tensor(g, flat_grad)
            del flat_grad
            g /= dist.get_world_size()
            self.m.mul_(beta1).add_(g, alpha=1 - beta1)
            self.v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (self.v / (1 - beta2 ** self.t)).sqrt_().add_(self.eps)
            mine = self.master[self.lo:self.lo + self.shard]
            mine.addcdiv_(self.m, denom, value=-self.lr / (1 - beta1 ** self.t))
            flat = torch.empty(self.numel, dtype=torch.float64)
            dist.all_gather_into_tensor(flat, mine.clone())
            offset = 0
            for w in self.weights:
                w.copy_(flat[offset:offset + w.numel()].view_as(w))
                offset += w.numel()
