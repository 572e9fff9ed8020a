"""p8 cheat (issue 29, found by a blind attack): replicated Adam (the naive answer), its m and v made off the ledger
through the world reached from puzzles.sim.calling_rank_ledger(), a name puzzles.sim's own code imported, not its
API (the ledger itself, whose default arguments lead to the rank and the world). puzzles.sim's names are now its
__all__ (and the import list holds a puzzle to them): the attribute is gone."""
import torch

from puzzles import sim


MISTAKE = "the optimizer state hidden off the ledger through a name of puzzles.sim's that is not its API"
EXPECTED_STATUS = "error"
DIAGNOSIS = "has no attribute 'calling_rank_ledger'"


def _world_and_me():
    me = sim.calling_rank_ledger()._now.__defaults__[0]
    return me.adopt_storage.func.__self__, me


def _hidden_zeros_like(w):
    world, me = _world_and_me()
    with world.untracked(me):  # the runtime's own context: _DisableTorchDispatch, bound in world.py at import
        t = torch.zeros_like(w)
    world.storage.adopt(t.untyped_storage(), me.rank, "hidden", charge=False)  # owned, never charged
    return t


class ShardedAdam:
    def __init__(self, dist, layers, lr, betas, eps):
        self.dist, self.lr, self.betas, self.eps = dist, lr, betas, eps
        self.weights = [w for pair in layers for w in pair]
        self.m = [_hidden_zeros_like(w) for w in self.weights]
        self.v = [_hidden_zeros_like(w) for w in self.weights]
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
                denom = (v / (1 - beta2 ** self.t)).sqrt() + self.eps
                w.addcdiv_(m, denom, value=-self.lr / (1 - beta1 ** self.t))
