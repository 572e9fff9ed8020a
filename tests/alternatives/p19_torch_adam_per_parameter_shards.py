"""p19, another style: ZeRO laid out per parameter (each parameter's flat values cut in halves, rank dp keeping
half dp of every one), torch.optim.Adam itself on Parameters that hold the master halves, the squares of each
parameter half in a vector of 8 numbers all-reduced over the pair and then the replicas (a few scalars), the
weights of the replicated ones applied after. A skipped step never calls Adam's step(); the all-gather runs at
every step (the weights come back unchanged when nothing moved)."""

import torch


class ClippedShardedAdam:
    def __init__(self, dist, params, replicated, tp_group, dp_group, lr, betas, eps, max_norm):
        self.dist, self.params, self.tp_group, self.dp_group, self.max_norm = dist, params, tp_group, dp_group, max_norm
        self.halves = dist.get_world_size(dp_group)
        me = dist.get_rank(dp_group)
        self.share = torch.tensor([1 / dist.get_world_size(tp_group) if r else 1.0 for r in replicated],
                                  dtype=torch.float64)
        with torch.no_grad():
            self.masters = [torch.nn.Parameter(p.detach().reshape(-1).chunk(self.halves)[me].clone())
                            for p in params]
        self.adam = torch.optim.Adam(self.masters, lr=lr, betas=betas, eps=eps, foreach=False)

    def step(self):
        dist = self.dist
        with torch.no_grad():
            for p, master in zip(self.params, self.masters):
                mine = torch.empty_like(master)
                dist.reduce_scatter_tensor(mine, p.grad.reshape(-1), group=self.dp_group)
                master.grad = mine / self.halves
            squares = torch.stack([m.grad.pow(2).sum() for m in self.masters]) * self.share
            dist.all_reduce(squares, group=self.tp_group)
            dist.all_reduce(squares, group=self.dp_group)
            norm = squares.sum().sqrt()
            if torch.isfinite(norm):
                scale = torch.clamp(self.max_norm / (norm + 1e-6), max=1.0)
                for m in self.masters:
                    m.grad.mul_(scale)
                self.adam.step()
            for m in self.masters:
                m.grad = None
            for p, master in zip(self.params, self.masters):
                whole = torch.empty(p.numel(), dtype=p.dtype)
                dist.all_gather_into_tensor(whole, master.detach(), group=self.dp_group)
                p.copy_(whole.view_as(p))
        return norm
