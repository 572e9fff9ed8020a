"""p7, another style: one flat gradient buffer for the whole model, made before the step; each weight's hook
copies its gradient into the weight's slice and all-reduces that slice asynchronously, so the copies run while
the previous slices' messages are in flight (they hide nothing themselves; the backward's matmuls after them do).
After backward every handle is waited for, each summed slice copied back into w.grad, and the update divides by N."""

import torch

from puzzles.model import forward, loss_fn


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    weights = [w for pair in layers for w in pair]
    offsets, total = {}, 0
    for w in weights:
        offsets[w] = total
        total += w.numel()
    flat = torch.empty(total, dtype=weights[0].dtype)
    pending = []

    def slice_of(w):
        return flat[offsets[w]:offsets[w] + w.numel()].view_as(w)

    def launch(w):
        part = slice_of(w)
        part.copy_(w.grad)
        pending.append(dist.all_reduce(part, async_op=True))

    hooks = [w.register_post_accumulate_grad_hook(launch) for w in weights]
    loss_fn(forward(x_shard, layers), target_shard).backward()
    for h in hooks:
        h.remove()
    for work in pending:
        work.wait()
    world = dist.get_world_size()
    with torch.no_grad():
        for w in weights:
            w.grad.copy_(slice_of(w))  # the sum: the learning rate does the dividing
            w -= lr / world * w.grad
