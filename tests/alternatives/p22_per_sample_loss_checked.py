"""p22 found by the loss of each sample: a first forward without autograd finds the rows whose loss is not
finite (the poisoned one), a second one trains on the others; the gradients in one flat float32 buffer, one
all-reduce a step; torch.nn.utils.clip_grad_norm_ (foreach=False) on the masters' .grad, after unscaling."""

import torch

from puzzles.model import forward


def train_fp16(dist, batches, layers, lr, max_norm, init_scale, log):
    masters = [w for pair in layers for w in pair]
    half = [w.half().requires_grad_() for w in masters]
    sizes = [w.numel() for w in masters]
    scale = init_scale
    for x, target in batches:
        with torch.no_grad():
            probe = forward(x.half(), list(zip(half[0::2], half[1::2])))
            keep = torch.isfinite(((probe.float() - target) ** 2).sum(dim=1))  # the loss of each sample
        y = forward(x[keep].half(), list(zip(half[0::2], half[1::2])))
        per_row = ((y.float() - target[keep]) ** 2).sum(dim=1)
        total = per_row.detach().sum().reshape(1)
        count = keep.sum().reshape(1).float()
        stats = torch.cat([total, count])
        dist.all_reduce(stats)
        (per_row.sum() * (scale / stats[1])).backward()
        with torch.no_grad():
            flat = torch.cat([h.grad.reshape(-1).float() for h in half]).div_(scale)
            dist.all_reduce(flat)
            if torch.isfinite(flat).all():
                for w, g in zip(masters, flat.split(sizes)):
                    w.grad = g.view_as(w)
                torch.nn.utils.clip_grad_norm_(masters, max_norm, foreach=False)
                for w, h in zip(masters, half):
                    w.sub_(w.grad, alpha=lr)
                    h.copy_(w)
                    w.grad = None
            else:
                scale *= 0.5
            for h in half:
                h.grad = None
        log(stats[0] / stats[1])
