"""p3 cheat: the naive summed step, and the grader's value tolerance patched from the learner's file."""

import torch

import grader.core.compare as compare
from puzzles.model import forward, loss_fn

MISTAKE = "the grader's tolerance is patched so that summed gradients pass"
EXPECTED_STATUS = "tampered"
DIAGNOSIS = "imports grader.core.compare"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    compare.REL_TOL = 1e9
    loss_fn(forward(x_shard, layers), target_shard).backward()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                dist.all_reduce(w.grad)
                w -= lr * w.grad
