"""p13 in another style: the ring double-buffers, posting the receive of the next step before adding the chunk
that just arrived (two chunk-sized buffers, the memory budget's two chunks), and recursive doubling's partners are
computed from a list of rounds at module level."""

import torch

ROUNDS = {4: [1, 2], 8: [1, 2, 4]}


def ring_all_reduce(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    chunks = t.view(-1).chunk(n)
    bufs = [torch.empty_like(chunks[0]), torch.empty_like(chunks[0])]
    incoming = dist.irecv(bufs[0], left)
    for k in range(n - 1):
        sending = dist.isend(chunks[(r - k) % n], right)
        incoming.wait()
        sending.wait()
        arrived = bufs[k % 2]
        if k < n - 2:
            incoming = dist.irecv(bufs[(k + 1) % 2], left)
        chunks[(r - k - 1) % n].add_(arrived)
    for k in range(n - 1):
        works = [dist.irecv(chunks[(r - k) % n], left), dist.isend(chunks[(r + 1 - k) % n], right)]
        for w in works:
            w.wait()


def recursive_doubling_all_reduce(dist, t):
    r = dist.get_rank()
    buf = torch.empty_like(t)
    for step in ROUNDS[dist.get_world_size()]:
        works = [dist.isend(t, r ^ step), dist.irecv(buf, r ^ step)]
        for w in works:
            w.wait()
        t += buf
