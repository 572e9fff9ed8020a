"""p7 cheat (issue 29, found by a blind attack): the all-reduces after backward, each made to take 0 ticks on its
way to the clock. A work handle leads by no attribute to the op any more, so the cheat digs the simulator's Work
out of its module through `torch.sys.modules` (names built at run time), and sets the duration of each matched op
while an unmatched irecv on rank 0 holds it off the clock. The grader re-derives every communication event from
the puzzle's cost model: the run is not a measurement."""
import torch

from puzzles.model import forward, loss_fn

MISTAKE = "every all-reduce's ticks set to 0 through the simulator's own Work, held off the clock meanwhile"
EXPECTED_STATUS = "tampered"
DIAGNOSIS = "the puzzle's cost model gives"


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    rank = dist.get_rank()
    world = dist.get_world_size()
    blocker = None
    if rank == 0:
        buf = torch.zeros(1, dtype=torch.float64)
        blocker = dist.irecv(buf, src=1)  # unmatched: holds rank 0's queue, so matched ops wait off the clock
    loss_fn(forward(x_shard, layers), target_shard).backward()
    works = []
    for w1, w2 in layers:
        for w in (w1, w2):
            works.append(dist.all_reduce(w.grad, async_op=True))
    handles = getattr(torch.sys.modules["puzzles.simu" + "lator.types"], "_HAND" + "LED").of
    for h in works:
        q = getattr(handles[id(h)], "_que" + "ued")
        if q is not None and q.op is not None:
            q.op.ticks = 0
    sent = None
    if rank == 1:
        sent = dist.isend(torch.zeros(1, dtype=torch.float64), dst=0)
    for h in works:
        h.wait()
    if blocker is not None:
        blocker.wait()
    if sent is not None:
        sent.wait()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                w -= lr / world * w.grad
