"""Naive p8: plain data parallel with a full Adam on every rank: all-reduce the gradients, average, and update
every weight with its own m and v. Correct weights, data parallel's communication, but N x the optimizer state."""

import torch

EXPECTED_FAILURES = {"optimizer state"}
DIAGNOSIS = "the whole Adam state is replicated"


class ShardedAdam:
    def __init__(self, dist, layers, lr, betas, eps):
        self.dist, self.lr, self.betas, self.eps = dist, lr, betas, eps
        self.weights = [w for pair in layers for w in pair]
        self.m = [torch.zeros_like(w) for w in self.weights]
        self.v = [torch.zeros_like(w) for w in self.weights]
        self.t = 0

    def step(self):
        beta1, beta2 = self.betas
        self.t += 1
        with torch.no_grad():
            for w, m, v in zip(self.weights, self.m, self.v):
                self.dist.all_reduce(w.grad)
                g = w.grad / self.dist.get_world_size()
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                denom = (v / (1 - beta2 ** self.t)).sqrt() + self.eps
                w.addcdiv_(m, denom, value=-self.lr / (1 - beta1 ** self.t))
