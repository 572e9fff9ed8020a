"""p8 cheat: replicated Adam (every rank keeps m and v for every weight), with the moments allocated once at module
level, when the file is imported, so that the optimizer state measured between steps (what the rank holds beyond
what it held before the optimizer existed) looks like nothing. Refused: tensors made at import count as memory."""

import torch

MISTAKE = "the full (unsharded) Adam moments are preallocated at module level to hide them from the state budget"
EXPECTED_STATUS = "error"
DIAGNOSIS = "bytes of tensors at import"

D, H, L = 32, 64, 2  # the puzzle's sizes (its text)
_MOMENTS = [torch.zeros(D * H, dtype=torch.float64) for _ in range(4 * L)]  # m and v of every weight, flat


class ShardedAdam:
    def __init__(self, dist, layers, lr, betas, eps):
        self.dist, self.lr, self.betas, self.eps = dist, lr, betas, eps
        self.weights = [w for pair in layers for w in pair]
        self.m = [buf.view_as(w) for buf, w in zip(_MOMENTS[::2], self.weights)]
        self.v = [buf.view_as(w) for buf, w in zip(_MOMENTS[1::2], self.weights)]
        self.t = 0

    def step(self):
        beta1, beta2 = self.betas
        self.t += 1
        n = self.dist.get_world_size()
        with torch.no_grad():
            for w, m, v in zip(self.weights, self.m, self.v):
                self.dist.all_reduce(w.grad)
                g = w.grad / n
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                w.addcdiv_(m, (v / (1 - beta2 ** self.t)).sqrt() + self.eps, value=-self.lr / (1 - beta1 ** self.t))
