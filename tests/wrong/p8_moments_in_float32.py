"""p8 mistake: the master copy is float64, but Adam's moments m and v are kept in float32 ("half the memory").
After three steps the weights are off by about 1e-9, inside the weights' tolerance: the state's dtype is the
rule that catches it (the text keeps the master copy, m and v in float64, as the weights are)."""

import torch

MISTAKE = "Adam's m and v are kept in float32 while the master copy is float64"
EXPECTED_FAILURES = {"state in float64"}
DIAGNOSIS = "optimizer state kept in float32"


class ShardedAdam:
    def __init__(self, dist, layers, lr, betas, eps):
        self.dist, self.lr, self.betas, self.eps = dist, lr, betas, eps
        self.weights = [w for pair in layers for w in pair]
        self.numel = sum(w.numel() for w in self.weights)
        self.shard = self.numel // dist.get_world_size()
        lo = dist.get_rank() * self.shard
        with torch.no_grad():
            self.master = torch.cat([w.reshape(-1) for w in self.weights])[lo:lo + self.shard].clone()
        self.m = torch.zeros(self.shard, dtype=torch.float32)  # the mistake: float32 moments
        self.v = torch.zeros(self.shard, dtype=torch.float32)
        self.t = 0

    def step(self):
        beta1, beta2 = self.betas
        self.t += 1
        with torch.no_grad():
            flat_grad = torch.cat([w.grad.reshape(-1) for w in self.weights])
            g = torch.empty_like(self.master)
            self.dist.reduce_scatter_tensor(g, flat_grad)
            del flat_grad
            g /= self.dist.get_world_size()
            self.m.mul_(beta1).add_(g.float(), alpha=1 - beta1)
            self.v.mul_(beta2).addcmul_(g.float(), g.float(), value=1 - beta2)
            denom = (self.v.double() / (1 - beta2 ** self.t)).sqrt_().add_(self.eps)
            self.master.addcdiv_(self.m.double(), denom, value=-self.lr / (1 - beta1 ** self.t))
            flat = torch.empty(self.numel, dtype=self.master.dtype)
            self.dist.all_gather_into_tensor(flat, self.master)
            offset = 0
            for w in self.weights:
                w.copy_(flat[offset:offset + w.numel()].view_as(w))
                offset += w.numel()
