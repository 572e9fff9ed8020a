"""p7 cheat: the synchronous step of puzzle 3, after making communication free by patching the simulator's cost
model from the learner's file."""

import torch

import puzzles.simulator.clock as clock
from puzzles.model import forward, loss_fn

MISTAKE = "the simulator's cost model is patched so that communication costs nothing"
EXPECTED_STATUS = "tampered"
DIAGNOSIS = "imports puzzles.simulator.clock"


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    clock.CostModel.comm_ticks = lambda self, kind, nbytes, group_size: 0
    loss_fn(forward(x_shard, layers), target_shard).backward()
    world = dist.get_world_size()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                dist.all_reduce(w.grad)
                w -= lr / world * w.grad
