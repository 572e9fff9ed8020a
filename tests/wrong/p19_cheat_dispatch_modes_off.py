"""p19 cheat (found blind): replicated Adam, its state built and updated with torch's dispatch modes switched off
(reached through getattr with computed names) and kept in a module-level dict: "optimizer state 0 bytes", and
the answer passed. Switching the modes off from a rank is now refused where it is done."""

import torch

MISTAKE = "replicated Adam hidden from the ledger by switching the dispatch modes off"
EXPECTED_STATUS = "error"
DIAGNOSIS = "switched torch's dispatch modes off"

HIDE = True


def _off():
    if not HIDE:
        import contextlib
        return contextlib.nullcontext()
    m = getattr(torch.utils, "_python" + "_dispatch")
    return getattr(m, "_disable" + "_current_modes")()


_HIDDEN = {}  # the state lives here, out of the optimizer object's attributes


class ClippedShardedAdam:
    def __init__(self, dist, params, replicated, tp_group, dp_group, lr, betas, eps, max_norm):
        self.dist, self.params, self.tp, self.dpg = dist, list(params), tp_group, dp_group
        self.lr, self.betas, self.eps, self.max_norm = lr, betas, eps, max_norm
        self.T = dist.get_world_size(tp_group)
        self.D = dist.get_world_size(dp_group)
        self.rep = list(replicated)
        with _off():
            master = [p.detach().clone() for p in self.params]
            _HIDDEN[id(self)] = (master, [torch.zeros_like(p) for p in master], [torch.zeros_like(p) for p in master])
        self.t = 0

    @torch.no_grad()
    def step(self):
        dist = self.dist
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        dist.all_reduce(flat, group=self.dpg)
        flat /= self.D
        grads = list(flat.split([p.numel() for p in self.params]))
        s = torch.zeros(1, dtype=torch.float64)
        for g, rep in zip(grads, self.rep):
            s += (g * g).sum() / (self.T if rep else 1)
        # s holds this replica's whole tensor-parallel half; the pair's halves add (replicated counted /T on each)
        dist.all_reduce(s, group=self.tp)
        norm = s.sqrt()
        if not torch.isfinite(norm).all():
            return norm
        coef = (self.max_norm / (norm + 1e-6)).clamp(max=1.0)
        self.t += 1
        b1, b2 = self.betas
        with _off():
            master, ms, vs = _HIDDEN[id(self)]
            for p, w, m, v, g in zip(self.params, master, ms, vs, grads):
                g = g.view_as(p) * coef
                m.lerp_(g, 1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (v.sqrt() / (1 - b2 ** self.t) ** 0.5).add_(self.eps)
                w.addcdiv_(m, denom, value=-self.lr / (1 - b1 ** self.t))
            for p, w in zip(self.params, master):
                p.copy_(w)
        return norm
