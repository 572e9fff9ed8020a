"""p8, another style: ZeRO-2 keeping only m and v for the shard; the shard of the weights is read off the
weights themselves at every step (16·Ψ/N of state instead of 24·Ψ/N)."""

import torch


class ShardedAdam:
    def __init__(self, dist, layers, lr, betas, eps):
        self.dist, self.lr, self.betas, self.eps, self.t = dist, lr, betas, eps, 0
        self.weights = [w for pair in layers for w in pair]
        n = sum(w.numel() for w in self.weights)
        self.shard = n // dist.get_world_size()
        self.lo = dist.get_rank() * self.shard
        self.m = torch.zeros(self.shard, dtype=torch.float64)
        self.v = torch.zeros(self.shard, dtype=torch.float64)

    def step(self):
        b1, b2 = self.betas
        self.t += 1
        with torch.no_grad():
            flat = torch.cat([w.grad.reshape(-1) for w in self.weights])
            g = torch.empty(self.shard, dtype=torch.float64)
            self.dist.reduce_scatter_tensor(g, flat, op=self.dist.ReduceOp.AVG)
            self.m.mul_(b1).add_(g, alpha=1 - b1)
            self.v.mul_(b2).addcmul_(g, g, value=1 - b2)
            flat = torch.cat([w.reshape(-1) for w in self.weights])
            shard = flat[self.lo:self.lo + self.shard].clone()
            shard.addcdiv_(self.m, (self.v / (1 - b2 ** self.t)).sqrt() + self.eps, value=-self.lr / (1 - b1 ** self.t))
            self.dist.all_gather_into_tensor(flat, shard)
            offset = 0
            for w in self.weights:
                w.copy_(flat[offset:offset + w.numel()].view_as(w))
                offset += w.numel()
