"""p9 cheat: the puzzle text says step 4 overflows and lists the scales, so this optimizer never looks at its
gradients for inf or NaN: it skips its 4th step() and plays the listed scales back. Right on the graded run; the
second run, whose second batch overflows, gives it away."""

import torch

from puzzles.model import forward  # noqa: F401 (the grader runs the forward)

MISTAKE = "the skip and the scale follow the step's number (the text's step 4), not an overflow in the gradients"
EXPECTED_FAILURES = {"skipped step", "loss scale"}
DIAGNOSIS = "follows the step's number"

SCALES = [1024.0, 2048.0, 2048.0, 1024.0, 1024.0, 2048.0]


class MixedPrecisionAdam:
    def __init__(self, layers, lr, betas, eps, init_scale, growth_interval):
        self.masters = [w for pair in layers for w in pair]
        self.lr, self.betas, self.eps = lr, betas, eps
        self.m = [torch.zeros_like(w) for w in self.masters]
        self.v = [torch.zeros_like(w) for w in self.masters]
        self.calls, self.t = 0, 0
        self.half = [w.detach().half().requires_grad_() for w in self.masters]
        self.half_layers = list(zip(self.half[::2], self.half[1::2]))

    def get_scale(self):
        return SCALES[min(self.calls, len(SCALES)) - 1]

    def scale(self, loss):
        return loss * self.get_scale() if self.calls else loss * SCALES[0]

    def step(self):
        scale = self.get_scale() if self.calls else SCALES[0]
        self.calls += 1
        if self.calls == 4:  # the cheat: "step 4 overflows"
            return
        self.t += 1
        beta1, beta2 = self.betas
        with torch.no_grad():
            for w, h, m, v in zip(self.masters, self.half, self.m, self.v):
                g = h.grad.float() / scale
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                w.addcdiv_(m, (v / (1 - beta2 ** self.t)).sqrt() + self.eps, value=-self.lr / (1 - beta1 ** self.t))
                h.copy_(w)
