"""p3 cheat (issue 29, modules): the gradients are averaged through an in-memory SQLite database that every rank
(a thread of one process) opens by the same name, no byte on the wire. No import statement names the module: the
answer reaches `__import__` through a builtin's `__self__`, by a computed name, and imports sqlite3 while its run is
on, where no static scan of its source sees it. The import is refused where it happens, by Python's "import" audit
event (puzzles/simulator/allowed.py): sqlite3 is not on the list of what a puzzle may import
(puzzles/simulator/modules.py). (Had sqlite3 already been loaded by then, the event would not fire; the gradients'
numbers taken out of torch would still be refused by the running total of guards.py.)"""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the gradients averaged through a shared in-memory SQLite database, imported by a computed name"
EXPECTED_STATUS = "error"
DIAGNOSIS = "imports sqlite3"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    load = getattr(print.__self__, "_".join(["", "", "import", "", ""]))
    db = load("sq" + "lite3").connect("file:p3?mode=memory&cache=shared", uri=True, check_same_thread=False)
    rank, world = dist.get_rank(), dist.get_world_size()
    db.execute("create table if not exists g (rank int, i int, v blob)")
    grads = [w.grad for pair in layers for w in pair]
    for i, g in enumerate(grads):
        db.execute("insert into g values (?, ?, ?)", (rank, i, g.numpy().tobytes()))
    dist.barrier()
    with torch.no_grad():
        for i, g in enumerate(grads):
            rows = db.execute("select v from g where i = ?", (i,)).fetchall()
            g.copy_(sum(torch.frombuffer(bytearray(v), dtype=g.dtype).view_as(g) for (v,) in rows) / world)
        for w1, w2 in layers:
            w1 -= lr * w1.grad
            w2 -= lr * w2.grad
