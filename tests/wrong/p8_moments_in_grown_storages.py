"""p8 cheat: replicated Adam whose m and v live in one-number tensors whose storages were grown in place
(`untyped_storage().resize_`, which no op sees) and then viewed whole with set_ (the ledger once charged each
storage only for the 8 bytes it was made with)."""

import torch

MISTAKE = "the whole Adam state is replicated, in storages grown by untyped_storage().resize_ to hide it"
EXPECTED_FAILURES = {"optimizer state"}
DIAGNOSIS = "the whole Adam state is replicated"


def grown_zeros(like):
    t = torch.zeros(1, dtype=like.dtype)
    t.untyped_storage().resize_(like.numel() * like.element_size())
    return t.set_(t.untyped_storage(), 0, like.shape).zero_()


class ShardedAdam:
    def __init__(self, dist, layers, lr, betas, eps):
        self.dist, self.lr, self.betas, self.eps = dist, lr, betas, eps
        self.weights = [w for pair in layers for w in pair]
        self.m = [grown_zeros(w) for w in self.weights]
        self.v = [grown_zeros(w) for w in self.weights]
        self.t = 0

    def step(self):
        beta1, beta2 = self.betas
        self.t += 1
        with torch.no_grad():
            for w, m, v in zip(self.weights, self.m, self.v):
                self.dist.all_reduce(w.grad)
                g = w.grad / self.dist.get_world_size()
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                w.addcdiv_(m, (v / (1 - beta2 ** self.t)).sqrt() + self.eps, value=-self.lr / (1 - beta1 ** self.t))
