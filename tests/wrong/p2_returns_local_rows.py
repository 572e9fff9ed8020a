"""p2 mistake: the forward returns only this rank's rows of y (sharding the output as well), where the grader
expects the whole output on every rank."""

import torch

from puzzles.model import block, forward

MISTAKE = "the forward returns this rank's rows of y instead of the whole output"
EXPECTED_STATUS = "error"
DIAGNOSIS = "must return y, the stack's output [256, 32]"


def sharded_forward(dist, x, layers, k):
    rank, world = dist.get_rank(), dist.get_world_size()
    saved = []
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                saved.append(x.chunk(world)[rank].clone())
            x = block(x, w1, w2)
    return saved, x.chunk(world)[rank].clone()


def sharded_backward(dist, saved, layers, k, grad_y):
    raise AssertionError("not reached: the grader stops at the forward's output")
