"""p22 with the poisoned rows replaced, not removed: every row keeps its place, a row whose input is not finite
becomes zeros (torch.where) and its loss is weighed 0, so the forward never sees a NaN; the loss's share is the
masked sum over the global count. Clipping done by hand, each weight's squared norm all-reduced with its
gradient's sum in one buffer per weight."""

import torch

from puzzles.model import forward


def train_fp16(dist, batches, layers, lr, max_norm, init_scale, log):
    w16 = [(w1.to(torch.float16).requires_grad_(), w2.to(torch.float16).requires_grad_()) for w1, w2 in layers]
    scale = init_scale
    for x, target in batches:
        good = torch.isfinite(x).all(dim=1, keepdim=True)
        clean = torch.where(good, x, torch.zeros_like(x))  # the NaN never enters the forward
        y = forward(clean.to(torch.float16), w16).to(torch.float32)
        weight = good.squeeze(1).to(torch.float32)
        per_row = ((y - target) ** 2).sum(dim=1) * weight
        stats = torch.stack([per_row.detach().sum(), weight.sum()])
        dist.all_reduce(stats)
        ((per_row / stats[1]).sum() * scale).backward()
        with torch.no_grad():
            grads = []
            for pair in w16:
                for h in pair:
                    g = h.grad.to(torch.float32) / scale
                    dist.all_reduce(g)
                    grads.append(g)
                    h.grad = None
            square = sum(g.square().sum() for g in grads)
            if torch.isfinite(square):
                coef = (max_norm / (square.sqrt() + 1e-6)).clamp(max=1.0)
                for (w1, w2), (h1, h2), g1, g2 in zip(layers, w16, grads[0::2], grads[1::2]):
                    w1.add_(g1 * coef, alpha=-lr)
                    w2.add_(g2 * coef, alpha=-lr)
                    h1.copy_(w1)
                    h2.copy_(w2)
            else:
                scale = scale / 2
        log(stats[0] / stats[1])
