"""p3 cheat (issue 29, processes): rank 0 forks a child that computes the whole batch's gradient and writes it
back through a pipe, where neither the clock nor the memory ledger of any rank sees the work. A rank may start no
process now (puzzles/simulator/allowed.py): the fork is refused where it is called.
Before any of that, since issue 29's list of modules, the file is refused where it imports os
(puzzles/simulator/modules.py): it is not graded. The rule above still holds by itself ("started a process
(os.fork)", tests/test_sim_threads.py, test_allowed_leaving_torch.py, test_sim_filesystem.py)."""

import os

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the whole batch's step computed in a forked process, off the clock and the ledger"
EXPECTED_STATUS = "error"
DIAGNOSIS = "imports os"


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
