"""p9 mistake: scale() returns the loss unchanged. step() still divides the gradients by the scale, so they
are scale times too small (the smallest lost in float16), the overflowing batch of step 4 does not overflow, and
the step is taken: the skip looks missing, but the step's own check is fine."""

import torch

MISTAKE = "scale() returns the loss as it is: the scale is tracked but never applied"
EXPECTED_FAILURES = {"weights after each step", "skipped step", "loss scale"}
DIAGNOSIS = "scale() does not multiply the loss by the loss scale"


class MixedPrecisionAdam:
    def __init__(self, layers, lr, betas, eps, init_scale, growth_interval):
        self.lr, self.betas, self.eps = lr, betas, eps
        self.master = [w for pair in layers for w in pair]  # float32, updated in place
        self.half_layers = [(w1.half().requires_grad_(), w2.half().requires_grad_()) for w1, w2 in layers]
        self.half = [w for pair in self.half_layers for w in pair]
        self.m = [torch.zeros_like(w) for w in self.master]
        self.v = [torch.zeros_like(w) for w in self.master]
        self.loss_scale = init_scale
        self.growth_interval = growth_interval
        self.good_steps = 0  # steps in a row without overflow
        self.t = 0  # Adam's step count: the steps taken

    def scale(self, loss):
        return loss  # the scale is only tracked, never applied

    def step(self):
        beta1, beta2 = self.betas
        with torch.no_grad():
            grads = [w.grad.float() / self.loss_scale for w in self.half]  # unscaled, in float32
            if not all(torch.isfinite(g).all() for g in grads):
                self.loss_scale /= 2  # overflow: skip the step, try a smaller scale
                self.good_steps = 0
                return
            self.t += 1
            for w, g, m, v, h in zip(self.master, grads, self.m, self.v, self.half):
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                denom = (v / (1 - beta2 ** self.t)).sqrt() + self.eps
                w.addcdiv_(m, denom, value=-self.lr / (1 - beta1 ** self.t))
                h.copy_(w)  # the new float16 weights, rounded from the master copy
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.loss_scale *= 2
                self.good_steps = 0

    def get_scale(self):
        return self.loss_scale
