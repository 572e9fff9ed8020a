"""p7 mistake: the hooks are registered twice (a loop over the layers run twice over), so each gradient's second
hook launches another all-reduce on it while the first is still in flight: a race on real hardware, an error
here, named."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "each gradient's hook is registered twice, so each gradient is all-reduced twice"
EXPECTED_STATUS = "error"
DIAGNOSIS = "was still in flight"


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    pending = []

    def launch(w):
        pending.append(dist.all_reduce(w.grad, async_op=True))

    hooks = [w.register_post_accumulate_grad_hook(launch) for _ in range(2) for pair in layers for w in pair]
    loss_fn(forward(x_shard, layers), target_shard).backward()
    for work in pending:
        work.wait()
    for h in hooks:
        h.remove()
    world = dist.get_world_size()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                w -= lr / world ** 2 * w.grad
