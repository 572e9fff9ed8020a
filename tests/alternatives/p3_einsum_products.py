"""p3, another style: the blocks written with torch.einsum for their products (einsum reaches the dispatcher as
the matrix products it is made of, each charged by its formula)."""

import torch
import torch.nn.functional as F

from puzzles.model import loss_fn


def forward_einsum(x, layers):
    for w1, w2 in layers:
        x = x + torch.einsum("bh,hd->bd", F.gelu(torch.einsum("bd,dh->bh", x, w1)), w2)
    return x


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward_einsum(x_shard, layers), target_shard).backward()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                dist.all_reduce(w.grad, op=dist.ReduceOp.SUM)
                w.grad.div_(dist.get_world_size())
                w.sub_(lr * w.grad)
