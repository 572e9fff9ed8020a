"""p16 mistake: 1F1B's warm-up, p - 1 - rank forwards, in the interleaved order. A microbatch must go round the
ranks twice before its first gradient comes back, so rank 0 asks for chunk 1's gradient of microbatch 0 while
the later stages still wait for forwards it has not run: every rank waits on another."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "1F1B's warm-up count (p - 1 - rank) with two chunks per rank"
EXPECTED_STATUS = "error"
DIAGNOSIS = "KeyError"


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

    warmup = min(world - 1 - rank, units)
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
