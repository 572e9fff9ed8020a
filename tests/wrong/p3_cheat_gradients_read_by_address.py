"""p3 cheat (issue 29, raw memory): every rank publishes its gradients' addresses in a dict shared through the
interpreter (builtins), then reads the other ranks' gradients straight out of memory with ctypes, reached as an
attribute of torch (no `import ctypes` to scan for), and averages them: a few bytes on the wire for a whole
all-reduce. Inside a rank, data_ptr() now gives an opaque number, not the address (puzzles/simulator/guards.py),
and ctypes is refused by any path (allowed.py, by its audit events).
Before any of that, since issue 29's list of modules, the file is refused where it imports builtins
(puzzles/simulator/modules.py): it is not graded. The rule above still holds by itself ("used ctypes",
tests/test_sim_threads.py, test_allowed_leaving_torch.py, test_sim_filesystem.py)."""

import builtins

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the other ranks' gradients read by address through torch.ctypes instead of all-reduced"
EXPECTED_STATUS = "error"
DIAGNOSIS = "imports builtins"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    grads = [w.grad for pair in layers for w in pair]
    addresses = [(g.data_ptr(), g.numel()) for g in grads]
    assert torch.ctypes.string_at(addresses[0][0], 8)  # the address reads back
    shared = builtins.__dict__.setdefault("_p3_addresses", {})
    shared[dist.get_rank()] = addresses
    dist.barrier()  # every rank's addresses are out
    world = dist.get_world_size()
    with torch.no_grad():
        for i, g in enumerate(grads):
            total = g.clone()
            for r, entries in shared.items():
                if r != dist.get_rank():
                    ptr, n = entries[i]
                    raw = torch.ctypes.string_at(ptr, n * 8)
                    total += torch.frombuffer(bytearray(raw), dtype=torch.float64).view_as(g)
            g.copy_(total / world)
        for w1, w2 in layers:
            w1 -= lr * w1.grad
            w2 -= lr * w2.grad
