"""p19 mistake: the replicated parameters' gradients are all-reduced over the tensor-parallel pair, as if each rank
held a partial sum (it would under sequence parallelism, puzzle 14): here f's backward all-reduce already gave both
ranks the whole gradient, so the norms' scales and the biases get twice theirs."""

import torch

MISTAKE = "the replicated parameters' gradients are summed over the tensor-parallel pair, though already whole"
EXPECTED_FAILURES = {"weights after each step", "global norm"}
DIAGNOSIS = "were they all-reduced over the tensor-parallel pair"


class ClippedShardedAdam:
    def __init__(self, dist, params, replicated, tp_group, dp_group, lr, betas, eps, max_norm):
        self.dist, self.params, self.replicated = dist, params, replicated
        self.tp_group, self.dp_group = tp_group, dp_group
        self.lr, self.betas, self.eps, self.max_norm = lr, betas, eps, max_norm
        self.size, self.pair = dist.get_world_size(dp_group), dist.get_world_size(tp_group)
        self.shard = sum(p.numel() for p in params) // self.size
        lo = dist.get_rank(dp_group) * self.shard
        self.ranges, offset = [], 0
        for p, rep in zip(params, replicated):
            start, end = max(offset, lo), min(offset + p.numel(), lo + self.shard)
            if start < end:
                self.ranges.append((start - lo, end - lo, rep))
            offset += p.numel()
        with torch.no_grad():
            self.master = torch.cat([p.reshape(-1) for p in params])[lo:lo + self.shard].clone()
        self.m, self.v, self.t = torch.zeros_like(self.master), torch.zeros_like(self.master), 0

    def step(self):
        beta1, beta2 = self.betas
        with torch.no_grad():
            for p, rep in zip(self.params, self.replicated):
                if rep:
                    self.dist.all_reduce(p.grad, group=self.tp_group)  # "the pair's partial sums"
            g = torch.empty_like(self.master)
            self.dist.reduce_scatter_tensor(g, torch.cat([p.grad.reshape(-1) for p in self.params]),
                                            group=self.dp_group)
            g /= self.size
            squares = torch.zeros((), dtype=torch.float64)
            for a, b, rep in self.ranges:
                squares += g[a:b].pow(2).sum() / (self.pair if rep else 1)
            self.dist.all_reduce(squares)
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
            self.dist.all_gather_into_tensor(flat, self.master, group=self.dp_group)
            for p, piece in zip(self.params, flat.split([p.numel() for p in self.params])):
                p.copy_(piece.view_as(p))
        return norm
