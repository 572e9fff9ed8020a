"""p9 mistake: Adam's step count t is incremented before the overflow check, so the skipped step counts: from step 5
on, the bias corrections use t one too large."""

import torch

MISTAKE = "Adam's t counts the skipped step"
EXPECTED_FAILURES = {"weights after each step"}
DIAGNOSIS = "counted the skipped step"


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
            self.t += 1
            grads = [w.grad.float() / self.loss_scale for w in self.half]
            if not all(torch.isfinite(g).all() for g in grads):
                self.loss_scale /= 2
                self.good_steps = 0
                return
            for w, g, m, v, h in zip(self.master, grads, self.m, self.v, self.half):
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                denom = (v / (1 - beta2 ** self.t)).sqrt_().add_(self.eps)
                w.addcdiv_(m, denom, value=-self.lr / (1 - beta1 ** self.t))
                h.copy_(w)
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.loss_scale *= 2
                self.good_steps = 0

    def get_scale(self):
        return self.loss_scale
