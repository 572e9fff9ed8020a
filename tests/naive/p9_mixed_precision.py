"""Naive p9: mixed precision with a static loss scale: float16 forward and backward, float32 master weights and
Adam, gradients unscaled, but every step taken and the scale never changed. Right until step 4, whose scaled
gradients overflow float16: its inf and NaN go into m, v and every weight."""

import torch

EXPECTED_FAILURES = {"weights after each step", "skipped step", "loss scale"}
DIAGNOSIS = "the step whose gradients overflowed"


class MixedPrecisionAdam:
    def __init__(self, layers, lr, betas, eps, init_scale, growth_interval):
        self.lr, self.betas, self.eps, self.loss_scale = lr, betas, eps, init_scale
        self.master = [w for pair in layers for w in pair]
        self.half_layers = [(w1.half().requires_grad_(), w2.half().requires_grad_()) for w1, w2 in layers]
        self.m = [torch.zeros_like(w) for w in self.master]
        self.v = [torch.zeros_like(w) for w in self.master]
        self.t = 0

    def scale(self, loss):
        return loss * self.loss_scale

    def step(self):
        beta1, beta2 = self.betas
        self.t += 1
        with torch.no_grad():
            for w, h, m, v in zip(self.master, [w for pair in self.half_layers for w in pair], self.m, self.v):
                g = h.grad.float() / self.loss_scale
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                w.addcdiv_(m, (v / (1 - beta2 ** self.t)).sqrt() + self.eps, value=-self.lr / (1 - beta1 ** self.t))
                h.copy_(w)

    def get_scale(self):
        return self.loss_scale
