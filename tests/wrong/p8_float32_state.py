"""p8 mistake: master weights, m and v kept in float32 ("as in mixed precision"), and the all-gather carries float32
weights: 4 bytes a number where the float64 model needs 8, and the weights come out rounded."""

import torch

MISTAKE = "the master copy, m and v are float32 (and so is what the all-gather carries)"
EXPECTED_FAILURES = {"weights after k steps", "state in float64"}
DIAGNOSIS = "float32"


class ShardedAdam:
    def __init__(self, dist, layers, lr, betas, eps):
        self.dist, self.lr, self.betas, self.eps = dist, lr, betas, eps
        self.weights = [w for pair in layers for w in pair]
        self.numel = sum(w.numel() for w in self.weights)
        self.shard = self.numel // dist.get_world_size()
        lo = dist.get_rank() * self.shard
        with torch.no_grad():
            flat = torch.cat([w.reshape(-1) for w in self.weights])
            self.master = flat[lo:lo + self.shard].float()
        del flat
        self.m = torch.zeros_like(self.master)
        self.v = torch.zeros_like(self.master)
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
            g = (g / dist.get_world_size()).float()
            self.m.mul_(beta1).add_(g, alpha=1 - beta1)
            self.v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (self.v / (1 - beta2 ** self.t)).sqrt_().add_(self.eps)
            self.master.addcdiv_(self.m, denom, value=-self.lr / (1 - beta1 ** self.t))
            flat = torch.empty(self.numel, dtype=torch.float32)
            dist.all_gather_into_tensor(flat, self.master)
            offset = 0
            for w in self.weights:
                w.copy_(flat[offset:offset + w.numel()].view_as(w))
                offset += w.numel()
