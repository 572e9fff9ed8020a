"""p9 mistake: the non-finite gradients of the overflowing step are replaced by zeros (torch.nan_to_num) and the step
is taken: m, v, t and the weights all move."""

import torch

MISTAKE = "the overflowing step is taken with its inf and NaN gradients zeroed, instead of being skipped"
EXPECTED_FAILURES = {"weights after each step", "skipped step"}
DIAGNOSIS = "the step must be skipped"


class MixedPrecisionAdam:
    def __init__(self, layers, lr, betas, eps, init_scale, growth_interval):
        self.lr, self.betas, self.eps = lr, betas, eps
        self.master = [w for pair in layers for w in pair]
        self.half_layers = [(w1.detach().half().requires_grad_(), w2.detach().half().requires_grad_())
                            for w1, w2 in layers]
        self.half = [w for pair in self.half_layers for w in pair]
        self.m = [torch.zeros_like(w) for w in self.master]
        self.v = [torch.zeros_like(w) for w in self.master]
        self.loss_scale, self.growth_interval = init_scale, growth_interval
        self.good_steps = 0
        self.t = 0

    def scale(self, loss):
        return loss * self.loss_scale

    def step(self):
        beta1, beta2 = self.betas
        with torch.no_grad():
            grads = [w.grad.float() / self.loss_scale for w in self.half]
            overflow = not all(torch.isfinite(g).all() for g in grads)
            grads = [torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0) for g in grads]
            self.t += 1
            for w, g, m, v, h in zip(self.master, grads, self.m, self.v, self.half):
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                denom = (v / (1 - beta2 ** self.t)).sqrt_().add_(self.eps)
                w.addcdiv_(m, denom, value=-self.lr / (1 - beta1 ** self.t))
                h.copy_(w)
            if overflow:
                self.loss_scale /= 2
                self.good_steps = 0
                return
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.loss_scale *= 2
                self.good_steps = 0

    def get_scale(self):
        return self.loss_scale
