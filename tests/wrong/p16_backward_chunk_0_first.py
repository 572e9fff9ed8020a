"""p16 mistake: the backwards in the forwards' chunk order (chunk 0 before chunk 1). A microbatch's gradient
reaches a rank's chunk 1 first (it comes back from the end of the model), so rank 3 waits for chunk 0's
gradient from rank 0, which waits for its own chunk 0's from rank 1, ...: a cycle."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "backwards run chunk 0 first, as the forwards do"
EXPECTED_STATUS = "error"
DIAGNOSIS = "every rank that has not returned is blocked"


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
        return c, i

    held = {}  # (chunk, microbatch) -> (its input, its output): forwarded, not yet backwarded
    activation_sends = {}  # (chunk, microbatch) -> the isend of its output, until its gradient comes back
    gradient_sends = []
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
                activation_sends[c, i] = dist.isend(y.detach(), (rank + 1) % world)
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
                activation_sends.pop((c, i)).wait()  # its gradient is back: the next rank had the activation
                y.backward(g)
            if stage > 0:
                gradient_sends.append(dist.isend(a.grad, (rank - 1) % world))
        input_grads[c][i] = a.grad

    warmup = min((world - rank - 1) * 2 + (v - 1) * world, units)
    for j in range(warmup):
        run_forward(j)
    for j in range(units - warmup):  # steady state: one forward, one backward
        run_forward(warmup + j)
        run_backward(j)
    for j in range(units - warmup, units):  # cool-down
        run_backward(j)
    for work in gradient_sends:
        work.wait()
    return [torch.cat(grads) for grads in input_grads]
