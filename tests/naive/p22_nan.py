"""Naive p22: the program as handed out, "fixed" the way a search for the error suggests: torch.nan_to_num on
the gradients, so that no step is skipped any more. The nan is gone from the gradients and every cause is still
there: the poisoned step is zeroed, the spike step is zeroed, and the clipping still sees the scaled gradients."""

import torch

from puzzles.model import forward

EXPECTED_FAILURES = {"loss curve", "weights", "every step taken"}
DIAGNOSIS = "workaround"


def train_fp16(dist, batches, layers, lr, max_norm, init_scale, log):
    masters = [w for pair in layers for w in pair]
    half = [w.half().requires_grad_() for w in masters]
    scale = init_scale
    for x, target in batches:
        y = forward(x.half(), list(zip(half[0::2], half[1::2])))
        loss = ((y - target.half()) ** 2).sum(dim=1).mean()  # float16 throughout
        (loss * scale).backward()
        grads = [h.grad.float() for h in half]
        for g in grads:
            dist.all_reduce(g)
        with torch.no_grad():
            norm = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
            coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
            grads = [g * coef / scale / dist.get_world_size() for g in grads]  # clipped, then unscaled
            grads = [torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0) for g in grads]
            if not all(torch.isfinite(g).all() for g in grads):
                scale /= 2  # skip the step
            else:
                for w, g, h in zip(masters, grads, half):
                    w -= lr * g
                    h.copy_(w)
            for h in half:
                h.grad = None
        logged = loss.detach().float()
        dist.all_reduce(logged)
        log(logged / dist.get_world_size())
