"""p3 cheat (issue 29, levers): the forward and backward run under torch._C._ForceDispatchKeyGuard with the
Python dispatch key excluded, so no op reaches the simulator's mode: the compute check saw nothing. Every lever
that takes ops past the modes is refused from a rank's own code now (puzzles/simulator/escapes.py)."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the step computed past the dispatch modes with torch._C._ForceDispatchKeyGuard"
EXPECTED_STATUS = "error"
DIAGNOSIS = "_ForceDispatchKeyGuard"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    python = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(),
                                         torch._C._dispatch_tls_local_exclude_set() | python):
        loss_fn(forward(x_shard, layers), target_shard).backward()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                dist.all_reduce(w.grad)
                w.grad /= dist.get_world_size()
                w -= lr * w.grad
