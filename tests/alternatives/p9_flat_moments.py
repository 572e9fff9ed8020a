"""p9 with Adam on one flat float32 vector: the unscaled gradients concatenated, m and v each one tensor of Ψ
numbers, torch.optim.Adam's formula (sqrt(v) / sqrt(1 - beta2^t) + eps, m updated with lerp_), and the result
written back into the master weights and the float16 copies through views. The overflow test is one isfinite()
on the flat gradient."""

import math

import torch


class MixedPrecisionAdam:
    def __init__(self, layers, lr, betas, eps, init_scale, growth_interval):
        self.lr, self.beta1, self.beta2, self.eps = lr, betas[0], betas[1], eps
        self.master = [w for pair in layers for w in pair]
        self.half_layers = [(w1.detach().half().requires_grad_(), w2.detach().half().requires_grad_())
                            for w1, w2 in layers]
        n = sum(w.numel() for w in self.master)
        self.exp_avg = torch.zeros(n, dtype=torch.float32)
        self.exp_avg_sq = torch.zeros(n, dtype=torch.float32)
        self.steps_taken = 0
        self.scale_now, self.interval, self.streak = float(init_scale), growth_interval, 0

    def scale(self, loss):
        return loss * self.scale_now

    def _halves(self):
        return [w for pair in self.half_layers for w in pair]

    def step(self):
        with torch.no_grad():
            g = torch.cat([h.grad.reshape(-1) for h in self._halves()]).float().mul_(1.0 / self.scale_now)
            if not bool(torch.isfinite(g).all()):
                self.scale_now, self.streak = self.scale_now * 0.5, 0
                return
            self.steps_taken += 1
            t = self.steps_taken
            self.exp_avg.lerp_(g, 1 - self.beta1)
            self.exp_avg_sq.mul_(self.beta2).addcmul_(g, g, value=1 - self.beta2)
            denom = (self.exp_avg_sq.sqrt() / math.sqrt(1 - self.beta2 ** t)).add_(self.eps)
            update = (self.exp_avg / denom).mul_(-self.lr / (1 - self.beta1 ** t))
            offset = 0
            for w, h in zip(self.master, self._halves()):
                w.add_(update[offset:offset + w.numel()].view_as(w))
                h.copy_(w)
                offset += w.numel()
            self.streak += 1
            if self.streak >= self.interval:
                self.scale_now, self.streak = self.scale_now * 2.0, 0

    def get_scale(self):
        return self.scale_now
