"""p8 cheat: replicated Adam whose m and v are numpy arrays, out of the memory ledger's sight."""

import torch

MISTAKE = "the whole Adam state is replicated, kept as numpy arrays the ledger cannot see"
EXPECTED_STATUS = "error"
DIAGNOSIS = "HiddenMemoryError"


class ShardedAdam:
    def __init__(self, dist, layers, lr, betas, eps):
        self.dist, self.lr, self.betas, self.eps = dist, lr, betas, eps
        self.weights = [w for pair in layers for w in pair]
        self.m = [torch.zeros_like(w).numpy() for w in self.weights]
        self.v = [torch.zeros_like(w).numpy() for w in self.weights]
        self.t = 0

    def step(self):
        beta1, beta2 = self.betas
        self.t += 1
        with torch.no_grad():
            for i, w in enumerate(self.weights):
                self.dist.all_reduce(w.grad)
                g = w.grad / self.dist.get_world_size()
                m = torch.from_numpy(self.m[i]).mul_(beta1).add_(g, alpha=1 - beta1)
                v = torch.from_numpy(self.v[i]).mul_(beta2).addcmul_(g, g, value=1 - beta2)
                self.m[i], self.v[i] = m.numpy().copy(), v.numpy().copy()
                w.addcdiv_(m, (v / (1 - beta2 ** self.t)).sqrt() + self.eps, value=-self.lr / (1 - beta1 ** self.t))
