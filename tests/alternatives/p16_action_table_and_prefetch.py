"""p16, another style: each rank's whole order written out first as a table of (kind, chunk, microbatch) actions,
and every receive posted one action ahead with irecv, so that a message can land while the rank computes."""

import torch

from puzzles.model import forward, loss_fn


def schedule(rank, world, v, n_micro):
    """[("F" | "B", chunk, microbatch)] in the order `rank` runs them."""
    def unit(j, backward):
        group, k = divmod(j, world * v)
        chunk = k // world
        return ("B", v - 1 - chunk, group * world + k % world) if backward else ("F", chunk, group * world + k % world)

    units = n_micro * v
    warmup = min((world - rank - 1) * 2 + (v - 1) * world, units)
    order = [unit(j, False) for j in range(warmup)]
    for j in range(units - warmup):
        order += [unit(warmup + j, False), unit(j, True)]
    return order + [unit(j, True) for j in range(units - warmup, units)]


def interleaved_step(dist, chunks, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    v = len(chunks)
    first, last = 0, v * world - 1
    order = schedule(rank, world, v, n_micro)

    def needs_message(action):
        kind, c, _ = action
        stage = c * world + rank
        return (kind == "F" and stage != first) or (kind == "B" and stage != last)

    def post_receive(action):
        buf = torch.empty(micro_shape, dtype=torch.float64)
        peer = (rank - 1) % world if action[0] == "F" else (rank + 1) % world
        return buf, dist.irecv(buf, peer)

    inputs, outputs, grads = {}, {}, [[None] * n_micro for _ in range(v)]
    out_sends, grad_sends = {}, []
    pending = [n for n, a in enumerate(order) if needs_message(a)]  # the actions that wait for a message
    posted = {}
    if pending:
        posted[pending[0]] = post_receive(order[pending[0]])
    for n, (kind, c, i) in enumerate(order):
        later = [m for m in pending if m > n]
        if later and later[0] not in posted:  # the next receive goes out before this action's work
            posted[later[0]] = post_receive(order[later[0]])
        stage = c * world + rank
        if n in posted:
            buf, work = posted.pop(n)
            work.wait()
        if kind == "F":
            a = (x.chunk(n_micro)[i].detach() if stage == first else buf).requires_grad_()
            y = forward(a, chunks[c])
            if stage == last:
                y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
            else:
                out_sends[c, i] = dist.isend(y.detach(), (rank + 1) % world)
            inputs[c, i], outputs[c, i] = a, y
        else:
            a, y = inputs.pop((c, i)), outputs.pop((c, i))
            if stage == last:
                y.backward()
            else:
                out_sends.pop((c, i)).wait()
                y.backward(buf)
            if stage != first:
                grad_sends.append(dist.isend(a.grad, (rank - 1) % world))
            grads[c][i] = a.grad
    for work in grad_sends:
        work.wait()
    return [torch.cat(g) for g in grads]
