"""p5 cheat: every stage runs on rank 0. The other ranks send it their weights, rank 0 runs the whole model over
the microbatches and sends each rank its weight and input gradients back; meanwhile the other ranks burn FLOPs on
a dummy matmul so that nobody looks idle. Right gradients, and the compute streams look busy, but nothing runs in
parallel: the step takes p times as long."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "rank 0 runs every stage while the others only look busy"
EXPECTED_FAILURES = {"stage compute", "bubble"}
DIAGNOSIS = "every stage's blocks ran on one rank"


def gpipe_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    shapes = [w.shape for pair in layers for w in pair]
    if rank != 0:
        for w in (w for pair in layers for w in pair):
            dist.send(w.detach(), dst=0)
        if rank == world - 1:
            dist.send(target, dst=0)
        busy = torch.randn(256, 256, dtype=torch.float64)
        for _ in range(3):  # as many FLOPs as rank 0's four stages
            busy = busy @ busy / 256  # looks like work
        grads = []
        for shape in shapes:
            g = torch.empty(shape, dtype=torch.float64)
            dist.recv(g, src=0)
            grads.append(g)
        for w, g in zip((w for pair in layers for w in pair), grads):
            w.grad += g
        dx = torch.empty(micro_shape[0] * n_micro, micro_shape[1], dtype=torch.float64)
        dist.recv(dx, src=0)
        return dx
    stages = [layers]
    for r in range(1, world):
        ws = []
        for shape in shapes:
            w = torch.empty(shape, dtype=torch.float64)
            dist.recv(w, src=r)
            ws.append(w.requires_grad_())
        stages.append(list(zip(ws[::2], ws[1::2])))
    target = torch.empty(micro_shape[0] * n_micro, micro_shape[1], dtype=torch.float64)
    dist.recv(target, src=world - 1)
    boundaries = [[] for _ in range(world)]
    for i in range(n_micro):
        a = x.chunk(n_micro)[i].detach().requires_grad_()
        for r, stage in enumerate(stages):
            a.retain_grad()
            boundaries[r].append(a)
            a = forward(a, stage)
        (loss_fn(a, target.chunk(n_micro)[i]) / n_micro).backward()
    for r in range(1, world):
        for w in (w for pair in stages[r] for w in pair):
            dist.send(w.grad, dst=r)
        dist.send(torch.cat([a.grad for a in boundaries[r]]), dst=r)
    return torch.cat([a.grad for a in boundaries[0]])
