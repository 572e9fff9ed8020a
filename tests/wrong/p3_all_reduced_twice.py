"""p3 mistake: every gradient is all-reduced twice (a hook registered for it, and a loop after backward), and
divided by N twice to make up for it: the weights come out right, at twice the communication."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "every gradient is all-reduced twice (and divided twice to compensate)"
EXPECTED_FAILURES = {"communication", "compute"}  # every op counts: the gradient divided twice
DIAGNOSIS = "all-reduced more than once"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    world = dist.get_world_size()

    def reduce(w):
        dist.all_reduce(w.grad)
        w.grad /= world

    hooks = [w.register_post_accumulate_grad_hook(reduce) for pair in layers for w in pair]
    loss_fn(forward(x_shard, layers), target_shard).backward()
    for h in hooks:
        h.remove()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                dist.all_reduce(w.grad)  # again
                w.grad /= world
                w -= lr * w.grad
