"""p5 cheat (issue 18's second): a right GPipe with each stage's matrix products written as elementwise products and
sums, and the FLOP floor of a matmul-only count padded with dummy matmuls at tick 0 (its "bubble" came out 0.1%
under that clock). Every op counts now: the broadcasts cost their FLOPs and their memory traffic, so the padding
puts the stage far over its compute ceiling, and the step far over the bubble."""

import torch
import torch.nn.functional as F

from puzzles.model import loss_fn

MISTAKE = "the stages' matmuls written as elementwise products and sums, the FLOP floor padded with dummy matmuls"
EXPECTED_FAILURES = {"stage compute", "bubble"}  # the floor met by padding, the ceiling twice over, and slow
DIAGNOSIS = "padding to meet the floor"


def matmul(a, b):
    return (a[:, :, None] * b[None, :, :]).sum(1)


def stage(a, layers):
    for w1, w2 in layers:
        a = a + matmul(F.gelu(matmul(a, w1)), w2)
    return a


def gpipe_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    pad = torch.ones(64, 256, dtype=torch.float64)
    for _ in range(n_micro * 6 * len(layers)):  # as many matmul FLOPs as the stage's products, at tick 0
        torch.ones(8, 64, dtype=torch.float64) @ pad
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
