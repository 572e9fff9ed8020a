"""p8 mistake: the bias correction uses the step count before incrementing it (t = 0 at the first step), so the
first step divides by 1 - beta^0 = 0: Python's ZeroDivisionError, on the learner's line, which the likely cause
explains."""

import torch

MISTAKE = "the bias correction uses t = 0 at the first step (division by zero)"
EXPECTED_STATUS = "error"
DIAGNOSIS = "the step counter was 0 at the bias correction"


class ShardedAdam:
    def __init__(self, dist, layers, lr, betas, eps):
        self.dist, self.lr, self.betas, self.eps = dist, lr, betas, eps
        self.weights = [w for pair in layers for w in pair]
        self.numel = sum(w.numel() for w in self.weights)
        self.shard = self.numel // dist.get_world_size()
        lo = dist.get_rank() * self.shard
        with torch.no_grad():
            self.master = torch.cat([w.reshape(-1) for w in self.weights])[lo:lo + self.shard].clone()
        self.m = torch.zeros_like(self.master)
        self.v = torch.zeros_like(self.master)
        self.t = 0

    def step(self):
        dist = self.dist
        beta1, beta2 = self.betas
        with torch.no_grad():
            flat_grad = torch.cat([w.grad.reshape(-1) for w in self.weights])
            g = torch.empty_like(self.master)
            dist.reduce_scatter_tensor(g, flat_grad)
            del flat_grad
            g /= dist.get_world_size()
            self.m.mul_(beta1).add_(g, alpha=1 - beta1)
            self.v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (self.v / (1 - beta2 ** self.t)).sqrt_().add_(self.eps)
            self.master.addcdiv_(self.m, denom, value=-self.lr / (1 - beta1 ** self.t))
            self.t += 1  # too late
            flat = torch.empty(self.numel, dtype=torch.float64)
            dist.all_gather_into_tensor(flat, self.master)
            offset = 0
            for w in self.weights:
                w.copy_(flat[offset:offset + w.numel()].view_as(w))
                offset += w.numel()
