"""p8 cheat: replicated Adam whose m and v are kept between steps as sparse tensors (CSR), whose bytes live in
their indices and values rather than in a storage of their own (the ledger once missed them: "optimizer state 0
bytes", and p8 passed)."""

import torch

MISTAKE = "the whole Adam state is replicated, kept as sparse tensors to hide it from the ledger"
EXPECTED_FAILURES = {"optimizer state"}
DIAGNOSIS = "optimizer state between steps (48."  # values 8 + column indices 8 for each of m and v, + row pointers


class ShardedAdam:
    def __init__(self, dist, layers, lr, betas, eps):
        self.dist, self.lr, self.betas, self.eps = dist, lr, betas, eps
        self.weights = [w for pair in layers for w in pair]
        self.m = [torch.zeros_like(w).to_sparse_csr() for w in self.weights]
        self.v = [torch.zeros_like(w).to_sparse_csr() for w in self.weights]
        self.t = 0

    def step(self):
        beta1, beta2 = self.betas
        self.t += 1
        with torch.no_grad():
            for i, w in enumerate(self.weights):
                self.dist.all_reduce(w.grad)
                g = w.grad / self.dist.get_world_size()
                m = self.m[i].to_dense().mul_(beta1).add_(g, alpha=1 - beta1)
                v = self.v[i].to_dense().mul_(beta2).addcmul_(g, g, value=1 - beta2)
                w.addcdiv_(m, (v / (1 - beta2 ** self.t)).sqrt() + self.eps, value=-self.lr / (1 - beta1 ** self.t))
                self.m[i], self.v[i] = m.to_sparse_csr(), v.to_sparse_csr()
