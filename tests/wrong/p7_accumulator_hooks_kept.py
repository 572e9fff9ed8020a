"""p7 mistake: the all-reduces are launched from hooks on the weights' gradient accumulators (the AccumulateGrad
nodes, DDP's way, reached through w.expand_as(w).grad_fn), kept in a module-level list so that they live, and never
removed. Nothing on the tensor shows them; only a later backward does, which fires them again."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "hooks on the weights' AccumulateGrad nodes are kept alive and never removed"
EXPECTED_FAILURES = {"hooks removed"}
DIAGNOSIS = "remove them before returning"

accumulators = []  # keeps the nodes, and so their hooks, alive


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    pending = []
    for pair in layers:
        for w in pair:
            node = w.expand_as(w).grad_fn.next_functions[0][0]

            def launch(*_, w=w):
                pending.append(dist.all_reduce(w.grad, async_op=True))

            node.register_hook(launch)
            accumulators.append(node)
    loss_fn(forward(x_shard, layers), target_shard).backward()
    for work in pending:
        work.wait()
    world = dist.get_world_size()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                w -= lr / world * w.grad
