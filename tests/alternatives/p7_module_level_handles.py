"""p7, another style: the pending handles in a module-level list, and the hook a module-level function. Right on
torch.distributed, where each rank is its own process with its own module; on the simulator it needs each rank to
get its own instance of the learner's module."""

import torch

from puzzles.model import forward, loss_fn

PENDING = []
DIST = []


def launch(w):
    PENDING.append(DIST[0].all_reduce(w.grad, async_op=True))


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    DIST[:] = [dist]
    hooks = [w.register_post_accumulate_grad_hook(launch) for pair in layers for w in pair]
    loss_fn(forward(x_shard, layers), target_shard).backward()
    for h in hooks:
        h.remove()
    while PENDING:
        PENDING.pop(0).wait()
    world = dist.get_world_size()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                w -= lr / world * w.grad
