"""p16 cheat (found blind): every rank sends its chunks' weights to rank 0, which runs the whole model serially and sends
the gradients back. Right values; the compute, the bubble, the memory and the bytes say what happened."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the whole model run serially on rank 0"
EXPECTED_FAILURES = {"stage compute", "bubble", "activation memory", "point-to-point bytes"}
DIAGNOSIS = "it ran more of the model than its own chunks"


def interleaved_step(dist, chunks, x, target, n_micro, micro_shape):
    # every rank ships its weights to rank 0, which runs the whole model serially and sends the gradients back;
    # the input gradients are sent from rank 0 to whoever needs them
    r, p = dist.get_rank(), dist.get_world_size()
    v = len(chunks)
    if r == 0:
        allw = [[None] * p for _ in range(v)]
        for c in range(v):
            allw[c][0] = chunks[c]
            for s in range(1, p):
                w1 = torch.empty(64, 256, dtype=torch.float64); w2 = torch.empty(256, 64, dtype=torch.float64)
                dist.recv(w1, s); dist.recv(w2, s)
                allw[c][s] = [(w1.clone().requires_grad_(), w2.clone().requires_grad_())]
        tgt = torch.empty(64, 64, dtype=torch.float64); dist.recv(tgt, p - 1)
        stages = [allw[c][s] for c in range(v) for s in range(p)]
        ins = []
        h = x.detach().requires_grad_()
        for st in stages:
            h.retain_grad(); ins.append(h)
            h = forward(h, st)
        loss_fn(h, tgt).backward()
        for c in range(v):
            for s in range(1, p):
                (w1, w2), = allw[c][s]
                dist.send(w1.grad, s); dist.send(w2.grad, s)
                dist.send(ins[c * p + s].grad, s)
        return [ins[0].grad, ins[p].grad]
    for c in range(v):
        (w1, w2), = chunks[c]
        dist.send(w1.detach().contiguous(), 0); dist.send(w2.detach().contiguous(), 0)
    if r == p - 1:
        dist.send(target.contiguous(), 0)
    outs = []
    for c in range(v):
        (w1, w2), = chunks[c]
        g1 = torch.empty_like(w1); g2 = torch.empty_like(w2); gi = torch.empty(64, 64, dtype=torch.float64)
        dist.recv(g1, 0); dist.recv(g2, 0); dist.recv(gi, 0)
        w1.grad.copy_(g1) if w1.grad is not None else setattr(w1, "grad", g1)
        w2.grad.copy_(g2) if w2.grad is not None else setattr(w2, "grad", g2)
        outs.append(gi)
    return outs
