"""p8 mistake: step() all-gathers the master shards into the weights first and updates the master after,
so the layers always hold the master weights of the step before."""

import torch

MISTAKE = "the weights all-gathered at the start of step(), before the update"
EXPECTED_FAILURES = {"weights after k steps"}
DIAGNOSIS = "the weights are one step behind"


class ShardedAdam:
    def __init__(self, dist, layers, lr, betas, eps):
        self.dist, self.lr, self.betas, self.eps = dist, lr, betas, eps
        self.weights = [w for pair in layers for w in pair]
        self.numel = sum(w.numel() for w in self.weights)
        self.shard = self.numel // dist.get_world_size()
        lo = dist.get_rank() * self.shard
        with torch.no_grad():
            flat = torch.cat([w.reshape(-1) for w in self.weights])
            self.master = flat[lo:lo + self.shard].clone()  # a clone: a view would keep all of `flat` alive
        del flat
        self.m = torch.zeros_like(self.master)
        self.v = torch.zeros_like(self.master)
        self.t = 0

    def step(self):
        dist = self.dist
        beta1, beta2 = self.betas
        self.t += 1
        with torch.no_grad():
            flat = torch.empty(self.numel, dtype=self.master.dtype)
            dist.all_gather_into_tensor(flat, self.master)
            offset = 0
            for w in self.weights:
                w.copy_(flat[offset:offset + w.numel()].view_as(w))
                offset += w.numel()
            del flat
            flat_grad = torch.cat([w.grad.reshape(-1) for w in self.weights])
            g = torch.empty_like(self.master)
            dist.reduce_scatter_tensor(g, flat_grad)  # sums shard r of every rank's gradient into g
            del flat_grad
            g /= dist.get_world_size()
            self.m.mul_(beta1).add_(g, alpha=1 - beta1)
            self.v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (self.v / (1 - beta2 ** self.t)).sqrt_().add_(self.eps)
            self.master.addcdiv_(self.m, denom, value=-self.lr / (1 - beta1 ** self.t))
