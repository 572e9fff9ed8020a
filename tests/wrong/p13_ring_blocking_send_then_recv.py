"""p13 mistake: a ring of blocking sends and receives, ordered so that it cannot deadlock (even ranks send first,
odd ranks receive first). The values and bytes are right, but no rank ever sends while it receives: each step
takes two messages' time, and the ring's makespan doubles."""

import torch

MISTAKE = "blocking send and recv in turn (even ranks send first): sends never overlap receives"
EXPECTED_FAILURES = {"ring makespan"}
DIAGNOSIS = "never overlapped"


def exchange(dist, send, recv, right, left):
    if dist.get_rank() % 2 == 0:
        dist.send(send, right)
        dist.recv(recv, left)
    else:
        dist.recv(recv, left)
        dist.send(send, right)


def ring_all_reduce(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    chunks = t.view(-1).chunk(n)
    buf = torch.empty_like(chunks[0])
    for k in range(n - 1):
        exchange(dist, chunks[(r - k) % n], buf, right, left)
        chunks[(r - k - 1) % n].add_(buf)
    for k in range(n - 1):
        exchange(dist, chunks[(r + 1 - k) % n], chunks[(r - k) % n], right, left)


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
