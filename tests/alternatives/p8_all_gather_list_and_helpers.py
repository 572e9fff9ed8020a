"""p8, another style: module-level helpers to flatten and unflatten, Adam's update as a module-level function,
and the updated shards brought back with all_gather into a list of shards."""

import torch


def flatten(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten_into(flat, tensors):
    for t, piece in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(piece.view_as(t))


def adam_update(master, m, v, g, t, lr, betas, eps):
    """torch.optim.Adam's arithmetic, in place, on one shard."""
    b1, b2 = betas
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    master.addcdiv_(m, (v / (1 - b2 ** t)).sqrt_().add_(eps), value=-lr / (1 - b1 ** t))


class ShardedAdam:
    def __init__(self, dist, layers, lr, betas, eps):
        self.dist, self.hyper, self.t = dist, (lr, betas, eps), 0
        self.weights = [w for pair in layers for w in pair]
        world, rank = dist.get_world_size(), dist.get_rank()
        with torch.no_grad():
            self.master = flatten(self.weights).chunk(world)[rank].clone()
        self.m = torch.zeros_like(self.master)
        self.v = torch.zeros_like(self.master)

    def step(self):
        dist = self.dist
        self.t += 1
        with torch.no_grad():
            g = torch.empty_like(self.master)
            dist.reduce_scatter_tensor(g, flatten([w.grad for w in self.weights]))
            g /= dist.get_world_size()
            adam_update(self.master, self.m, self.v, g, self.t, *self.hyper)
            shards = [torch.empty_like(self.master) for _ in range(dist.get_world_size())]
            dist.all_gather(shards, self.master)
            unflatten_into(torch.cat(shards), self.weights)
