"""p5 cheat (issue 29): a GPipe whose messages are all on the clock but whose stages compute in a Python thread,
where neither the clock nor the FLOP count sees them, results written in place into the rank's own buffers; the
stage-compute floor is met with big products at the peak rate at tick 0. The makespan came out below the last
stage's own work, a bubble of 1 - W/makespan = -27.1%, and passed. A stage that sends a microbatch on without
having computed it since its input arrived is refused now.
First, though, the thread itself is refused where it is started (puzzles/simulator/allowed.py).
Before any of that, since issue 29's list of modules, the file is refused where it imports threading
(puzzles/simulator/modules.py): it is not graded. The rule above still holds by itself ("started a thread
(threading.Thread.start)", tests/test_sim_threads.py, test_allowed_leaving_torch.py, test_sim_filesystem.py)."""

import threading

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "every stage's work run in a thread, off the clock, with padding products for the compute floor"
EXPECTED_STATUS = "error"
DIAGNOSIS = "imports threading"


def off_clock(fn):
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("value", fn()))
    thread.start()
    thread.join()
    return box.get("value")

def gpipe_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    a, b = torch.ones(64, 64, dtype=torch.float64), torch.ones(64, 256, dtype=torch.float64)
    for _ in range(n_micro * 3 * len(layers) // 4):  # the FLOP floor at the peak rate
        a @ b
    first, last = rank == 0, rank == world - 1
    ws = [w for pair in layers for w in pair]
    grads_w = [torch.zeros_like(w) for w in ws]
    dx = torch.zeros(n_micro * micro_shape[0], micro_shape[1], dtype=torch.float64)
    acts = []
    for i in range(n_micro):
        h = x.chunk(n_micro)[i].detach() if first else torch.empty(micro_shape, dtype=torch.float64)
        if not first:
            dist.recv(h, src=rank - 1)
        acts.append(h)
        if not last:
            out = torch.empty(micro_shape, dtype=torch.float64)
            off_clock(lambda: out.copy_(forward(h, layers).detach()))
            dist.send(out, dst=rank + 1)
    for i in reversed(range(n_micro)):
        g = None
        if not last:
            g = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(g, src=rank + 1)
        def back():
            with torch.enable_grad():
                h = acts[i].detach().clone().requires_grad_()
                w = [t.detach().clone().requires_grad_() for t in ws]
                ls = [(w[2 * j], w[2 * j + 1]) for j in range(len(layers))]
                y = forward(h, ls)
                if last:
                    (loss_fn(y, target.chunk(n_micro)[i]) / n_micro).backward()
                else:
                    y.backward(g)
                for acc, t in zip(grads_w, w):
                    acc.add_(t.grad)
                dx[i * micro_shape[0]:(i + 1) * micro_shape[0]].copy_(h.grad)
        off_clock(back)
        if not first:
            dist.send(dx[i * micro_shape[0]:(i + 1) * micro_shape[0]].clone(), dst=rank - 1)
    for w, acc in zip(ws, grads_w):
        w.grad.copy_(acc)
    return dx
