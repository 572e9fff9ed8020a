"""p7 cheat (issue 29, levers): the synchronous all-reduces after backward (the naive answer), then the rank's clock
rewound to just after its backward through `dist`'s private field, reached by a name built at run time, so that
the communication would look hidden. `dist` is a view without levers: it holds no reference to the rank's state,
and the private name is an AttributeError that says so."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the rank's clock rewound through dist's private field to hide synchronous all-reduces"
EXPECTED_STATUS = "error"
DIAGNOSIS = "holds none of the simulator's state"


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    me = getattr(dist, "_" + "me")  # (a name built at run time: the static scan of internals cannot read it)
    after_backward = me.clock.compute
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                dist.all_reduce(w.grad)
                w -= lr / dist.get_world_size() * w.grad
    me.clock.compute = me.clock.comm = after_backward + 1
