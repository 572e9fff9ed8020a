"""p8 mistake: torch.optim.Adam on this rank's shard (a good idea), but the shard's .grad is left in place after
the step (no zero_grad), so a shard-size gradient outlives every step."""

import torch

MISTAKE = "torch.optim.Adam on the shard, with the shard's gradient left in .grad between steps"
EXPECTED_FAILURES = {"optimizer state"}
DIAGNOSIS = "one shard-size float64 vector"


class ShardedAdam:
    def __init__(self, dist, layers, lr, betas, eps):
        self.dist = dist
        self.weights = [w for pair in layers for w in pair]
        self.numel = sum(w.numel() for w in self.weights)
        shard = self.numel // dist.get_world_size()
        lo = dist.get_rank() * shard
        with torch.no_grad():
            master = torch.cat([w.reshape(-1) for w in self.weights])[lo:lo + shard].clone()
        self.master = torch.nn.Parameter(master)
        self.opt = torch.optim.Adam([self.master], lr=lr, betas=betas, eps=eps, foreach=False)

    def step(self):
        dist = self.dist
        with torch.no_grad():
            flat_grad = torch.cat([w.grad.reshape(-1) for w in self.weights])
            g = torch.empty_like(self.master)
            dist.reduce_scatter_tensor(g, flat_grad, op=dist.ReduceOp.AVG)
            del flat_grad
        self.master.grad = g
        self.opt.step()  # and no self.opt.zero_grad(): g stays alive in self.master.grad
        with torch.no_grad():
            flat = torch.empty(self.numel, dtype=self.master.dtype)
            dist.all_gather_into_tensor(flat, self.master.detach())
            offset = 0
            for w in self.weights:
                w.copy_(flat[offset:offset + w.numel()].view_as(w))
                offset += w.numel()
