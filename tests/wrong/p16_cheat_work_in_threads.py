"""p16 cheat (issue 29): the reference's interleaved order, every message on the clock, but every chunk's forward
and backward run in a Python thread, where neither the clock nor the FLOP count sees them, after products enough
for the stage-compute floor at the peak rate, at tick 0. Its makespan came out below the last rank's own work: a
bubble of (makespan - W)/W below zero, accepted. A rank that sends a microbatch on without having computed it since
its input arrived is refused now, whatever the bubble.
First, though, the thread itself is refused where it is started (puzzles/simulator/allowed.py).
Before any of that, since issue 29's list of modules, the file is refused where it imports threading
(puzzles/simulator/modules.py): it is not graded. The rule above still holds by itself ("started a thread
(threading.Thread.start)", tests/test_sim_threads.py, test_allowed_leaving_torch.py, test_sim_filesystem.py)."""

import threading

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "every chunk's work run in a thread, off the clock, with padding products for the compute floor"
EXPECTED_STATUS = "error"
DIAGNOSIS = "imports threading"


def off_clock(work):
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("value", work()))
    thread.start()
    thread.join()
    return box.get("value")


def interleaved_step(dist, chunks, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    v = len(chunks)
    a_pad, b_pad = torch.ones(64, 64, dtype=torch.float64), torch.ones(64, 256, dtype=torch.float64)
    for _ in range(12):  # the stage compute's product floor, at the peak rate, before anything else
        a_pad @ b_pad
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
            out = torch.empty(micro_shape, dtype=torch.float64)

            def work():
                with torch.enable_grad():
                    y = forward(a, chunks[c])
                    if stage == last_stage:
                        return loss_fn(y, target.chunk(n_micro)[i]) / n_micro
                    out.copy_(y.detach())
                    return y

            y = off_clock(work)
            if stage != last_stage:
                activation_sends[c, i] = dist.isend(out, (rank + 1) % world)
        held[c, i] = (a, y)

    def run_backward(j):
        c, i = backward_unit(j)
        stage = c * world + rank
        a, y = held.pop((c, i))
        with torch.profiler.record_function(f"B{i}.{c}"):
            g = None
            if stage != last_stage:
                g = torch.empty(micro_shape, dtype=torch.float64)
                dist.recv(g, src=(rank + 1) % world)
                activation_sends.pop((c, i)).wait()  # its gradient is back: the next rank had the activation
            grad = torch.empty(micro_shape, dtype=torch.float64)
            off_clock(lambda: (y.backward(g), grad.copy_(a.grad)))
            if stage > 0:
                gradient_sends.append(dist.isend(grad, (rank - 1) % world))
        input_grads[c][i] = grad

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
