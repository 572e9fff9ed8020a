"""p19, another style, Megatron's: the replicated parameters' squares added on tensor-parallel rank 0 only (as
Megatron's clip_grads filters out a tensor-parallel duplicate), and the inf/NaN test kept apart: a flag from every
rank's whole gradient, all-reduced with MAX over every rank, so a fault in either copy stops every rank."""

import torch


class ClippedShardedAdam:
    def __init__(self, dist, params, replicated, tp_group, dp_group, lr, betas, eps, max_norm):
        self.dist, self.params, self.tp_group, self.dp_group = dist, params, tp_group, dp_group
        self.lr, self.betas, self.eps, self.max_norm = lr, betas, eps, max_norm
        self.dp = dist.get_world_size(dp_group)
        self.numel = sum(p.numel() for p in params)
        self.shard = self.numel // self.dp
        self.lo = dist.get_rank(dp_group) * self.shard
        counted_here = dist.get_rank(tp_group) == 0
        self.norm_ranges, offset = [], 0
        for p, rep in zip(params, replicated):
            a, b = max(offset, self.lo), min(offset + p.numel(), self.lo + self.shard)
            if a < b and (counted_here or not rep):
                self.norm_ranges.append(slice(a - self.lo, b - self.lo))
            offset += p.numel()
        with torch.no_grad():
            self.master = torch.cat([p.reshape(-1) for p in params]).narrow(0, self.lo, self.shard).clone()
        self.exp_avg, self.exp_avg_sq, self.steps = torch.zeros_like(self.master), torch.zeros_like(self.master), 0

    def step(self):
        beta1, beta2 = self.betas
        with torch.no_grad():
            grads = [p.grad for p in self.params]
            found_inf = torch.stack([(~torch.isfinite(g)).any() for g in grads]).any().double()
            self.dist.all_reduce(found_inf, op=self.dist.ReduceOp.MAX)
            g = torch.empty_like(self.master)
            self.dist.reduce_scatter_tensor(g, torch.cat([x.reshape(-1) for x in grads]), group=self.dp_group)
            g /= self.dp
            total = torch.stack([g[r].square().sum() for r in self.norm_ranges]).sum()
            self.dist.all_reduce(total)
            norm = total.sqrt()
            if found_inf.item() > 0:
                return torch.tensor(float("nan"), dtype=torch.float64)
            self.steps += 1
            g.mul_((self.max_norm / (norm + 1e-6)).clamp(max=1.0))
            self.exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
            self.exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            bias1, bias2 = 1 - beta1 ** self.steps, 1 - beta2 ** self.steps
            self.master.addcdiv_(self.exp_avg, (self.exp_avg_sq / bias2).sqrt() + self.eps, value=-self.lr / bias1)
            full = torch.empty(self.numel, dtype=torch.float64)
            self.dist.all_gather_into_tensor(full, self.master, group=self.dp_group)
            offset = 0
            for p in self.params:
                p.copy_(full[offset:offset + p.numel()].reshape(p.shape))
                offset += p.numel()
        return norm
