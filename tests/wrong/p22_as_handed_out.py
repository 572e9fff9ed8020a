"""p22 as handed out: the stub with its first line deleted and nothing fixed."""

import torch

from puzzles.model import forward

MISTAKE = ("The program as handed out: the loss in float16 (inf at the spike step), the poisoned sample kept (nan), "
           "the gradients clipped before they are unscaled.")
EXPECTED_FAILURES = {"every step taken", "loss curve", "weights"}
DIAGNOSIS = "over float16's largest number"


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
