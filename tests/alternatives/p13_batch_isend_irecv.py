"""p13 in another style: every step's send and receive posted together with batch_isend_irecv (P2POp), the
chunks as slices of a flattened t (reshape), the loop written over the chunk indices themselves."""

import torch


def exchange(dist, send, send_to, recv, recv_from):
    ops = [dist.P2POp(dist.isend, send, send_to), dist.P2POp(dist.irecv, recv, recv_from)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def ring_all_reduce(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    flat = t.reshape(-1)
    size = flat.numel() // n

    def chunk(j):
        j %= n
        return flat[j * size:(j + 1) * size]

    buf = torch.empty(size, dtype=t.dtype)
    for sent in range(r, r - (n - 1), -1):
        exchange(dist, chunk(sent), (r + 1) % n, buf, (r - 1) % n)
        chunk(sent - 1).add_(buf)
    for done in range(r + 1, r + 1 - (n - 1), -1):
        exchange(dist, chunk(done), (r + 1) % n, chunk(done - 1), (r - 1) % n)


def recursive_doubling_all_reduce(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    buf = torch.empty_like(t)
    for k in range(n.bit_length() - 1):
        partner = r ^ (1 << k)
        exchange(dist, t, partner, buf, partner)
        t.add_(buf)
