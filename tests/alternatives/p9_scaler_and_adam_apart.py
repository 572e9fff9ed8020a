"""p9 as two small classes composed, the way a library splits it: a DynamicLossScaler (scale, unscale, the
overflow test, the update of the scale) and an Adam over lists of tensors (torch.optim.Adam's arithmetic written
with explicit bias-corrected moments); MixedPrecisionAdam wires them together. Module-level helpers, keyword
arguments, early return in another place."""

import torch


class DynamicLossScaler:
    def __init__(self, init_scale, growth_interval, growth_factor=2.0, backoff_factor=0.5):
        self.value = init_scale
        self.growth_interval, self.growth_factor, self.backoff_factor = growth_interval, growth_factor, backoff_factor
        self.good = 0

    def unscaled(self, grads16):
        return [g.to(torch.float32).div(self.value) for g in grads16]

    def update(self, overflowed):
        if overflowed:
            self.value *= self.backoff_factor
            self.good = 0
            return
        self.good += 1
        if self.good == self.growth_interval:
            self.value *= self.growth_factor
            self.good = 0


class Adam:
    def __init__(self, params, lr, betas, eps):
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    def apply(self, grads):
        self.t += 1
        b1, b2 = self.betas
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            m.mul_(b1).add_((1 - b1) * g)
            v.mul_(b2).add_((1 - b2) * g * g)
            m_hat = m / (1 - b1 ** self.t)
            v_hat = v / (1 - b2 ** self.t)
            p.sub_(self.lr * m_hat / (v_hat.sqrt() + self.eps))


def all_finite(tensors):
    return all(bool(torch.isfinite(t).all()) for t in tensors)


class MixedPrecisionAdam:
    def __init__(self, layers, lr, betas, eps, init_scale, growth_interval):
        masters = [w for pair in layers for w in pair]
        self.half_layers = [(a.detach().to(torch.float16).requires_grad_(True),
                             b.detach().to(torch.float16).requires_grad_(True)) for a, b in layers]
        self.scaler = DynamicLossScaler(init_scale, growth_interval)
        self.adam = Adam(masters, lr=lr, betas=betas, eps=eps)

    def scale(self, loss):
        return loss * self.scaler.value

    def step(self):
        halves = [w for pair in self.half_layers for w in pair]
        with torch.no_grad():
            grads = self.scaler.unscaled([h.grad for h in halves])
            overflowed = not all_finite(grads)
            if not overflowed:
                self.adam.apply(grads)
                for h, p in zip(halves, self.adam.params):
                    h.copy_(p)
        self.scaler.update(overflowed)

    def get_scale(self):
        return self.scaler.value
