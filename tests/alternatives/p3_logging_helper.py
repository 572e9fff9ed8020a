"""p3, another style: a logging helper that reads the loss and a few numbers out of torch each step (.item() and
a short tolist(), well within what a rank may take out of torch) and keeps them in a Python list."""

import torch

from puzzles.model import forward, loss_fn

LOG = []


def log(step, loss, grads):
    LOG.append({"step": step, "loss": loss.item(), "first gradient entries": grads[0][0, :4].tolist()})


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss = loss_fn(forward(x_shard, layers), target_shard)
    loss.backward()
    world = dist.get_world_size()
    with torch.no_grad():
        grads = [w.grad for pair in layers for w in pair]
        for g in grads:
            dist.all_reduce(g)
            g /= world
        log(len(LOG), loss.detach(), grads)
        for g, w in zip(grads, [w for pair in layers for w in pair]):
            w -= lr * g
