"""p3 cheat: every rank gathers the whole batch and runs the serial step, with its matrix products written as
products and sums of elements (broadcasting), which a matmul-only FLOP count would not see. Every op counts now:
the broadcast multiplies cost their FLOPs (4x the rank's share) and none of them are products."""

import torch
import torch.nn.functional as F

from puzzles.model import loss_fn

MISTAKE = "every rank runs the whole batch, its matmuls written as elementwise products and sums"
EXPECTED_FAILURES = {"compute"}
DIAGNOSIS = "written as elementwise multiplies and sums"


def matmul(a, b):
    return (a[:, :, None] * b[None, :, :]).sum(1)  # a @ b, element by element


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    world = dist.get_world_size()
    xs = [torch.empty_like(x_shard) for _ in range(world)]
    ts = [torch.empty_like(target_shard) for _ in range(world)]
    dist.all_gather(xs, x_shard)
    dist.all_gather(ts, target_shard)
    x = torch.cat(xs)
    for w1, w2 in layers:
        x = x + matmul(F.gelu(matmul(x, w1)), w2)
    loss_fn(x, torch.cat(ts)).backward()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                w -= lr * w.grad
