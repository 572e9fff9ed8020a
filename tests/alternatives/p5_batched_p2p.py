"""p5, another style: each message through batch_isend_irecv (one op per batch), and the microbatches' stage
inputs returned through a preallocated buffer filled row block by row block."""

import torch

from puzzles.model import forward, loss_fn


def gpipe_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1

    def p2p(op, tensor, peer):
        for work in dist.batch_isend_irecv([dist.P2POp(op, tensor, peer)]):
            work.wait()
        return tensor

    inputs, outputs = [], []
    for i in range(n_micro):
        if first:
            a = x.chunk(n_micro)[i].detach()
        else:
            a = p2p(dist.irecv, torch.empty(micro_shape, dtype=torch.float64), rank - 1)
        a.requires_grad_()
        y = forward(a, layers)
        if last:
            y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
        else:
            p2p(dist.isend, y.detach(), rank + 1)
        inputs.append(a)
        outputs.append(y)
    rows = micro_shape[0]
    dx = torch.empty(rows * n_micro, micro_shape[1], dtype=torch.float64)
    for i in reversed(range(n_micro)):
        if last:
            outputs[i].backward()
        else:
            outputs[i].backward(p2p(dist.irecv, torch.empty(micro_shape, dtype=torch.float64), rank + 1))
        dx[i * rows:(i + 1) * rows] = inputs[i].grad
        if not first:
            p2p(dist.isend, inputs[i].grad, rank - 1)
        inputs[i] = outputs[i] = None
    return dx
