"""p3 cheat (issue 29, modules): the gradients are averaged through a shelf (a dict kept in a file) that every
rank (a thread of one process) opens by the same name, no byte on the wire. No import statement names the module:
the answer reaches `__import__` through a builtin's `__self__`, by a computed name, and imports shelve while its run
is on, where no static scan of its source sees it. The import is refused where it happens, by Python's "import"
audit event (puzzles/simulator/allowed.py): shelve is not on the list of what a puzzle may import
(puzzles/simulator/modules.py). shelve was chosen over sqlite3 because nothing the grader or its tests import loads
it first (nbformat's signing loads sqlite3, and an already loaded module raises no import event); had it been
loaded, writing its file from a rank would still be refused."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the gradients averaged through a shelf in a file that every rank opens, imported by a computed name"
EXPECTED_STATUS = "error"
DIAGNOSIS = "imports shelve"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    load = getattr(print.__self__, "_".join(["", "", "import", "", ""]))
    shelf = load("shel" + "ve").open("/tmp/p3-gradients")
    rank, world = dist.get_rank(), dist.get_world_size()
    grads = [w.grad for pair in layers for w in pair]
    for i, g in enumerate(grads):
        shelf[f"{rank}-{i}"] = g.tolist()
    dist.barrier()
    with torch.no_grad():
        for i, g in enumerate(grads):
            g.copy_(sum(torch.tensor(shelf[f"{r}-{i}"], dtype=g.dtype) for r in range(world)) / world)
        for w1, w2 in layers:
            w1 -= lr * w1.grad
            w2 -= lr * w2.grad
