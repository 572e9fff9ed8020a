"""p5 cheat: a right GPipe, with each stage's matrix products written as products and sums of elements, which a
matmul-only FLOP count did not see (the stages looked free). Every op counts now: the broadcast multiplies and
sums cost as many FLOPs as the products, none of them in products (the floor), and four times the time (every
partial product goes to memory and back), so the bubble is far over too."""

import torch
import torch.nn.functional as F

from puzzles.model import loss_fn

MISTAKE = "the stages' matmuls are written as elementwise products and sums"
EXPECTED_FAILURES = {"stage compute", "bubble"}  # as many FLOPs, none of them products, and slow
DIAGNOSIS = "written as elementwise multiplies and sums"


def matmul(a, b):
    return (a[:, :, None] * b[None, :, :]).sum(1)


def stage(a, layers):
    for w1, w2 in layers:
        a = a + matmul(F.gelu(matmul(a, w1)), w2)
    return a


def gpipe_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    inputs, outputs = [], []
    for i in range(n_micro):
        if first:
            a = x.chunk(n_micro)[i].detach()
        else:
            a = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(a, src=rank - 1)
        a.requires_grad_()
        y = stage(a, layers)
        if last:
            y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
        else:
            dist.send(y.detach(), dst=rank + 1)
        inputs.append(a)
        outputs.append(y)
    grads = [None] * n_micro
    for i in reversed(range(n_micro)):
        if last:
            outputs[i].backward()
        else:
            g = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(g, src=rank + 1)
            outputs[i].backward(g)
        grads[i] = inputs[i].grad
        if not first:
            dist.send(grads[i], dst=rank - 1)
    return torch.cat(grads)
