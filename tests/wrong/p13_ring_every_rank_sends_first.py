"""p13 mistake: a ring of blocking calls in which every rank sends first, then receives. A blocking send waits for
its receive to be posted (here and on gloo), and every rank's neighbour is itself waiting in send: deadlock."""

import torch

MISTAKE = "every rank's blocking send comes before its receive: the ring deadlocks"
EXPECTED_STATUS = "error"
DIAGNOSIS = "DeadlockError"


def ring_all_reduce(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    chunks = t.view(-1).chunk(n)
    buf = torch.empty_like(chunks[0])
    for k in range(n - 1):
        dist.send(chunks[(r - k) % n], right)
        dist.recv(buf, left)
        chunks[(r - k - 1) % n].add_(buf)
    for k in range(n - 1):
        dist.send(chunks[(r + 1 - k) % n], right)
        dist.recv(chunks[(r - k) % n], left)


def recursive_doubling_all_reduce(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    buf = torch.empty_like(t)
    step = 1
    while step < n:
        works = [dist.isend(t, r ^ step), dist.irecv(buf, r ^ step)]
        for w in works:
            w.wait()
        t += buf
        step *= 2
