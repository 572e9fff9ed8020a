"""p3 cheat (issue 29, levers): the whole batch's gradient computed with the simulator's own switch `untracked`
on, which the runtime sets for its own copies: the ops ran off the ledger, the clock and the isolation check. `dist`
holds no reference to the rank's state any more (`dist._me` is an AttributeError), so the cheat digs it out of the
simulator's world module, loaded already, through a name built at run time. The flag is believed only while the
runtime's own code runs (puzzles/simulator/escapes.py): a rank that sets it is refused at its next op."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the real work done with the simulator's `untracked` flag switched on"
EXPECTED_STATUS = "error"
DIAGNOSIS = "switched the simulator's own flag"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    world_module = getattr(print.__self__, "__imp" + "ort__")("puzzles.simu" + "lator.world", fromlist=["_"])
    me = world_module._active.world.ranks[dist.get_rank()]  # (names built at run time: no static scan reads them)
    me.untracked = True
    try:
        loss_fn(forward(x_shard, layers), target_shard).backward()
    finally:
        me.untracked = False
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                dist.all_reduce(w.grad)
                w.grad /= dist.get_world_size()
                w -= lr * w.grad
