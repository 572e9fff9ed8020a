"""p6 cheat: GPipe's order, and rank 0 writes its ledger's peak down to nothing before returning, to pass the
memory budget. sim.current_ledger() hands a rank a read-only view of its ledger's figures, not the ledger (a view
without levers), so the write is refused where it is made. (The same write on the ledger itself, reached through
the simulator's internals, is tampering: tests/test_batch_sandbox.py.)"""

import torch

from puzzles import sim
from puzzles.model import forward, loss_fn

MISTAKE = "GPipe's order, with the peak of sim.current_ledger()'s view overwritten to pass the memory budget"
EXPECTED_STATUS = "error"
DIAGNOSIS = "its peak cannot be written"


def one_f_one_b_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    inputs, outputs = [], []
    for i in range(n_micro):
        if first:
            a = x.chunk(n_micro)[i].detach()
        else:
            a = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(a, src=rank - 1)
        a.requires_grad_()
        y = forward(a, layers)
        if last:
            y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
        else:
            dist.send(y.detach(), dst=rank + 1)
        inputs.append(a)
        outputs.append(y)
    input_grads = [None] * n_micro
    for i in reversed(range(n_micro)):
        if last:
            outputs[i].backward()
        else:
            g = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(g, src=rank + 1)
            outputs[i].backward(g)
        input_grads[i] = inputs[i].grad
        if not first:
            dist.send(input_grads[i], dst=rank - 1)
        inputs[i] = outputs[i] = None
    ledger = sim.current_ledger()
    if ledger is not None:
        ledger.peak = 0
    return torch.cat(input_grads)
