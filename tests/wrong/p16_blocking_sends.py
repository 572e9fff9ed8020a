"""p16 mistake: blocking sends (dist.send) for the activations and the gradients. A send here returns only when its
receive is posted, and the next rank posts it only when it runs that forward: rank 0's fourth send waits for rank
1, which waits to send to rank 2, ..., which waits for rank 0's next forward."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "blocking sends in the interleaved order"
EXPECTED_STATUS = "error"
DIAGNOSIS = "has posted no matching recv"


def interleaved_step(dist, chunks, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    v = len(chunks)
    last_stage = v * world - 1
    units = n_micro * v  # forwards (and backwards) this rank runs: every microbatch through each of its chunks

    def forward_unit(j):
        """(chunk, microbatch) of the j-th forward: groups of `world` microbatches, chunk 0 then chunk 1."""
        group, k = divmod(j, world * v)
        return k // world, group * world + k % world

    def backward_unit(j):
        c, i = forward_unit(j)
        return v - 1 - c, i  # the same groups, the last chunk first

    held = {}  # (chunk, microbatch) -> (its input, its output): forwarded, not yet backwarded
    input_grads = [[None] * n_micro for _ in range(v)]

    def run_forward(j):
        c, i = forward_unit(j)
        stage = c * world + rank
        with torch.profiler.record_function(f"F{i}.{c}"):
            if stage == 0:
                a = x.chunk(n_micro)[i].detach()
            else:
                a = torch.empty(micro_shape, dtype=torch.float64)
                dist.recv(a, src=(rank - 1) % world)
            a.requires_grad_()
            y = forward(a, chunks[c])
            if stage == last_stage:
                y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
            else:
                dist.send(y.detach(), (rank + 1) % world)
        held[c, i] = (a, y)

    def run_backward(j):
        c, i = backward_unit(j)
        stage = c * world + rank
        a, y = held.pop((c, i))
        with torch.profiler.record_function(f"B{i}.{c}"):
            if stage == last_stage:
                y.backward()
            else:
                g = torch.empty(micro_shape, dtype=torch.float64)
                dist.recv(g, src=(rank + 1) % world)
                y.backward(g)
            if stage > 0:
                dist.send(a.grad, (rank - 1) % world)
        input_grads[c][i] = a.grad

    warmup = min((world - rank - 1) * 2 + (v - 1) * world, units)
    for j in range(warmup):
        run_forward(j)
    for j in range(units - warmup):  # steady state: one forward, one backward
        run_forward(warmup + j)
        run_backward(j)
    for j in range(units - warmup, units):  # cool-down
        run_backward(j)
    return [torch.cat(grads) for grads in input_grads]
