"""p3 cheat (issue 29, raw memory): the gradients are averaged through Python lists shared by the ranks (threads of
one process), copied out of torch 64 numbers at a time, under the old guard's per-call limit, which kept no total:
no byte on the wire. What a rank takes out of torch is now counted into one running total per rank
(puzzles/simulator/guards.py), refused past a few thousand numbers.
Before any of that, since issue 29's list of modules, the file is refused where it imports builtins
(puzzles/simulator/modules.py): it is not graded. The rule above still holds by itself ("numbers out of tensors in
all", tests/test_sim_threads.py, test_allowed_leaving_torch.py, test_sim_filesystem.py)."""

import builtins

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the gradients averaged through Python lists shared by the ranks, copied out 64 numbers at a time"
EXPECTED_STATUS = "error"
DIAGNOSIS = "imports builtins"


def as_list(t):
    flat = t.reshape(-1)
    out = []
    for i in range(0, flat.numel(), 64):
        out += flat[i:i + 64].tolist()
    return out


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    grads = [w.grad for pair in layers for w in pair]
    lists = [as_list(g) for g in grads]
    shared = builtins.__dict__.setdefault("_p3_lists", {})
    shared[dist.get_rank()] = lists
    dist.barrier()
    world = dist.get_world_size()
    with torch.no_grad():
        for i, g in enumerate(grads):
            summed = [sum(vals) for vals in zip(*(shared[r][i] for r in range(world)))]
            g.copy_(torch.tensor(summed, dtype=torch.float64).view_as(g) / world)
        for w1, w2 in layers:
            w1 -= lr * w1.grad
            w2 -= lr * w2.grad
