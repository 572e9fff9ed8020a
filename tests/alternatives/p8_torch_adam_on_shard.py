"""p8, another style: torch.optim.Adam itself on this rank's shard, a Parameter holding the master shard; its
step counter is a 4-byte tensor of bookkeeping, within the budget's 1 KiB."""

import torch


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
            grad = torch.empty_like(self.master)
            dist.reduce_scatter_tensor(grad, flat_grad, op=dist.ReduceOp.AVG)
            del flat_grad
        self.master.grad = grad
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            flat = torch.empty(self.numel, dtype=self.master.dtype)
            dist.all_gather_into_tensor(flat, self.master.detach())
            for w, piece in zip(self.weights, flat.split([w.numel() for w in self.weights])):
                w.copy_(piece.view_as(w))
