"""p3 cheat (issue 29, processes): rank 0 forks a child that computes the whole batch's gradient and writes it
back through a pipe, where neither the clock nor the memory ledger of any rank sees the work. A rank may start no
process now (puzzles/simulator/allowed.py): the fork is refused where it is called."""

import os

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the whole batch's step computed in a forked process, off the clock and the ledger"
EXPECTED_STATUS = "error"
DIAGNOSIS = "started a process (os.fork)"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the work nobody counts
        loss_fn(forward(x_shard, layers), target_shard).backward()
        os.write(write, b"done")
        os._exit(0)
    os.read(read, 4)
    loss_fn(forward(x_shard, layers), target_shard).backward()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                dist.all_reduce(w.grad)
                w.grad /= dist.get_world_size()
                w -= lr * w.grad
