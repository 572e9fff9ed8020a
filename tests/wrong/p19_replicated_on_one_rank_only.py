"""p19 mistake: Megatron's filter without Megatron's separate check: the replicated parameters' squares are added
on tensor-parallel rank 0 only, and the skip is decided from that norm alone. An inf in rank 1's or rank 3's copy
of a replicated parameter never reaches any norm, so no rank skips step 5."""

import torch

MISTAKE = "replicated parameters counted on tensor-parallel rank 0 only, and nothing else checked for inf/NaN"
EXPECTED_FAILURES = {"weights after each step", "global norm", "skipped steps"}
DIAGNOSIS = "a replicated parameter counted on one rank of the pair only"


class ClippedShardedAdam:
    def __init__(self, dist, params, replicated, tp_group, dp_group, lr, betas, eps, max_norm):
        self.dist, self.params, self.tp_group, self.dp_group = dist, params, tp_group, dp_group
        self.lr, self.betas, self.eps, self.max_norm = lr, betas, eps, max_norm
        self.size = dist.get_world_size(dp_group)
        self.shard = sum(p.numel() for p in params) // self.size
        lo = dist.get_rank(dp_group) * self.shard
        first = dist.get_rank(tp_group) == 0
        self.counted, offset = [], 0  # (start, end) of the elements this rank adds to the norm
        for p, rep in zip(params, replicated):
            start, end = max(offset, lo), min(offset + p.numel(), lo + self.shard)
            if start < end and (first or not rep):
                self.counted.append((start - lo, end - lo))
            offset += p.numel()
        with torch.no_grad():
            self.master = torch.cat([p.reshape(-1) for p in params])[lo:lo + self.shard].clone()
        self.m, self.v, self.t = torch.zeros_like(self.master), torch.zeros_like(self.master), 0

    def step(self):
        beta1, beta2 = self.betas
        with torch.no_grad():
            g = torch.empty_like(self.master)
            self.dist.reduce_scatter_tensor(g, torch.cat([p.grad.reshape(-1) for p in self.params]),
                                            group=self.dp_group)
            g /= self.size
            squares = sum(g[a:b].pow(2).sum() for a, b in self.counted)
            self.dist.all_reduce(squares, group=self.tp_group)
            self.dist.all_reduce(squares, group=self.dp_group)
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
