"""p8 ZeRO (stage 2): reduce-scatter the gradients, Adam on the local 1/N shard, all-gather the weights.

Three checks: the weights after k Adam steps (against torch.optim.Adam on the serial model), the optimizer state
a rank keeps (the ledger, against K·Ψ/N bytes), and the bytes sent (against data parallel's all-reduce volume).
Adam is almost invariant to the scale of the gradient, so a forgotten average changes the weights only through
eps: a small error, which the float64 comparison still sees and the diagnosis names.
"""

from __future__ import annotations

import torch

from ..core import probe
from puzzles.model import forward, init_layers, loss_fn, make_batch
from puzzles.sim import CostModel

from ..core.result import Budget, Check, fmt
from ..core.spec import Observation, PuzzleSpec, check_layers

N, B, D, H, L, K_STEPS = 4, 32, 32, 64, 2, 3
LR, BETAS, EPS = 0.01, (0.9, 0.999), 1e-8
PSI = 2 * L * D * H  # number of weights
BYTES = 8  # float64
STATE_BYTES_PER_WEIGHT = 3 * BYTES  # K: master + m + v, float64
COST = CostModel(flops_per_tick=1024, latency_ticks=8, bytes_per_tick=512)
COMMS = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "all_gather", "broadcast", "send")


def adam_serial(layers, batches, lr, betas, eps, grad_scale=1.0, bias_correction=True):
    """k Adam steps of the serial model, one batch each: torch.optim.Adam's arithmetic, with two knobs that make
    the common mistakes (a gradient `grad_scale` times too large; no bias correction)."""
    ws = [w.detach().clone() for pair in layers for w in pair]
    m = [torch.zeros_like(w) for w in ws]
    v = [torch.zeros_like(w) for w in ws]
    beta1, beta2 = betas
    for t, (x, target) in enumerate(batches, 1):
        params = [w.clone().requires_grad_() for w in ws]
        loss_fn(forward(x, list(zip(params[::2], params[1::2]))), target).backward()
        bc1, bc2 = (1 - beta1 ** t, 1 - beta2 ** t) if bias_correction else (1.0, 1.0)
        for w, p, mi, vi in zip(ws, params, m, v):
            g = p.grad * grad_scale
            mi.mul_(beta1).add_(g, alpha=1 - beta1)
            vi.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            w.addcdiv_(mi, (vi / bc2).sqrt() + eps, value=-lr / bc1)
    return list(zip(ws[::2], ws[1::2]))


def torch_adam(layers, batches, lr, betas, eps):
    """The reference: torch.optim.Adam itself, k steps on the serial model."""
    ws = [w.detach().clone().requires_grad_() for pair in layers for w in pair]
    opt = torch.optim.Adam(ws, lr=lr, betas=betas, eps=eps, foreach=False)
    for x, target in batches:
        loss_fn(forward(x, list(zip(ws[::2], ws[1::2]))), target).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return [(w1.detach(), w2.detach()) for w1, w2 in zip(ws[::2], ws[1::2])]


def flat(layers) -> torch.Tensor:
    return torch.cat([w.detach().reshape(-1) for pair in layers for w in pair])


class Zero(PuzzleSpec):
    id, name, title = "p8", "zero", "ZeRO (sharded Adam)"
    entries = ("ShardedAdam",)
    world_size = N
    cost = COST
    hints = ("Each rank keeps master weights, m and v for its own 1/N slice of the flat weight vector; "
             "reduce_scatter_tensor gives it the summed gradient of exactly that slice.",)

    def make_inputs(self, seed):
        x, target = make_batch(B * K_STEPS, D, seed)
        batches = list(zip(x.chunk(K_STEPS), target.chunk(K_STEPS)))
        return {"layers": init_layers(L, D, H, seed + 1), "batches": batches}

    def reference(self, inputs):
        return {"layers": torch_adam(inputs["layers"], inputs["batches"], LR, BETAS, EPS)}

    def launch(self, inputs):
        per_rank = [([], []) for _ in range(N)]
        for x, target in inputs["batches"]:
            for r, (xs, ts) in enumerate(zip(x.chunk(N), target.chunk(N))):
                per_rank[r][0].append(xs)
                per_rank[r][1].append(ts)
        return (inputs["layers"], LR, BETAS, EPS), per_rank

    def program(self, module):
        adam = module.ShardedAdam

        def run(dist, layers, lr, betas, eps, xs, targets):
            before = probe.memory_now()
            opt = adam(dist, layers, lr, betas, eps)
            state = None
            for x, target in zip(xs, targets):
                loss = loss_fn(forward(x, layers), target)
                loss.backward()
                del loss
                opt.step()
                for pair in layers:
                    for w in pair:
                        w.grad = None
                if state is None:
                    state = probe.memory_now() - before
            return {"layers": [(w1.detach(), w2.detach()) for w1, w2 in layers], "state_bytes": state}

        return run

    def budgets(self, inputs):
        return {
            "optimizer state": Budget("optimizer state", "K·Ψ/N bytes, K = 24 (float64 master 8 + m 8 + v 8)",
                                      STATE_BYTES_PER_WEIGHT * PSI // N, "bytes"),
            "communication": Budget("communication",
                                    "2(N-1)/N · 8Ψ bytes per step x k steps (an all-reduce of the gradients)",
                                    2 * (N - 1) * BYTES * PSI // N * K_STEPS, "bytes"),
        }

    def check(self, obs: Observation, ref, inputs):
        got = [r["layers"] for r in obs.results]
        budgets = self.budgets(inputs)
        diagnose = lambda bad: self.diagnose(bad, got, ref, inputs)  # noqa: E731
        return [check_layers("weights after k steps", got, ref["layers"], f"weights after {K_STEPS} Adam steps",
                             diagnose),
                self.check_state(obs, budgets["optimizer state"]),
                self.check_communication(obs, budgets["communication"])]

    def check_state(self, obs: Observation, budget: Budget) -> Check:
        states = [r["state_bytes"] for r in obs.results]
        worst = max(range(len(states)), key=lambda r: states[r])
        s = states[worst]
        ok = s <= budget.value
        replicated = 2 * BYTES * PSI
        message = (f"rank {worst} holds {fmt(s, 'bytes')} of optimizer state after the first step "
                   f"({s / PSI:.3g} bytes per weight, Ψ = {PSI:,}), {'within' if ok else 'over'} the budget "
                   f"{budget.describe()}; replicated Adam would hold 2·8·Ψ = {fmt(replicated, 'bytes')} of moments. "
                   f"Per rank, all ranks: {', '.join(f'{x:,}' for x in states)} bytes")
        diagnosis = ""
        if not ok:
            if s >= replicated:
                diagnosis = (f"the whole Adam state is replicated on rank {worst}: m and v (and a master copy?) for "
                             f"every weight, not for this rank's 1/{N} slice. Keep them for the shard only")
            elif s - BYTES * PSI <= budget.value:
                diagnosis = (f"{fmt(s - budget.value, 'bytes')} over the budget, as if one full-size float64 vector "
                             f"(8Ψ = {fmt(BYTES * PSI, 'bytes')}) outlived the step. Is a shard a view of a flat "
                             f"buffer (`flat[lo:hi]` keeps all of `flat` alive: take `.clone()`), or a flat "
                             f"gradient or weight buffer kept as an attribute?")
        return Check("optimizer state", ok, message, measured=s, budget=budget, diagnosis=diagnosis)

    def check_communication(self, obs: Observation, budget: Budget) -> Check:
        sent = []
        for r in range(obs.world_size):
            by_kind = {}
            for e in obs.events_of(r, "comm"):
                by_kind[e["kind"]] = by_kind.get(e["kind"], 0) + e["wire_bytes"]
            sent.append(by_kind)
        totals = [sum(k.values()) for k in sent]
        wrong = [r for r, t in enumerate(totals) if t != budget.value]
        r = wrong[0] if wrong else 0
        parts = ", ".join(f"{kind} {fmt(b, 'bytes')}" for kind, b in sorted(sent[r].items())) or "nothing"
        if not wrong:
            return Check("communication", True, f"every rank sent {fmt(totals[0], 'bytes')} ({parts}), as much "
                         f"as data parallel: {budget.describe()}", measured=totals[0], budget=budget)
        t = totals[r]
        per_step = budget.value // K_STEPS
        diagnosis = ""
        if sent[r].get("all_reduce", 0) >= per_step * K_STEPS and t > budget.value:
            diagnosis = ("the full gradients were all-reduced, and the weights all-gathered on top: each rank needs "
                         "only the average of its own shard of the gradient, which a reduce-scatter (half an "
                         "all-reduce) gives it")
        elif 2 * t == budget.value:
            diagnosis = ("half of data parallel's volume: one of the two collectives is missing; were the updated "
                         "shards never all-gathered?")
        message = (f"rank {r} sent {fmt(t, 'bytes')} ({parts}); data parallel sends {budget.describe()}: "
                   f"{'more' if t > budget.value else 'less'} than a reduce-scatter plus an all-gather per step")
        return Check("communication", False, message, measured=t, budget=budget, diagnosis=diagnosis)

    def diagnose(self, bad, got, ref, inputs) -> str:
        """Name the likely mistake from the first rank whose weights are off."""
        rank = bad[0].meta[0]
        mine, start = flat(got[rank]), flat(inputs["layers"])
        if mine.shape != start.shape:
            return ""
        unchanged = (mine == start).double().mean().item()
        if unchanged > 0.99:
            return "the weights did not change: copy the gathered weights into each w in place (w.copy_(...))"
        if unchanged >= (N - 1) / N - 0.01:
            return (f"{100 * unchanged:.0f}% of rank {rank}'s weights still hold their initial values: only its "
                    f"own shard was updated. The updated shards were never all-gathered into the weights "
                    f"(all_gather_into_tensor, then copy into every w)")
        close = lambda layers: all(  # noqa: E731
            torch.allclose(a, b, rtol=0, atol=1e-8 * max(1.0, b.abs().max().item()))
            for pa, pb in zip(got[rank], layers) for a, b in zip(pa, pb))
        batches, layers = inputs["batches"], inputs["layers"]
        if close(adam_serial(layers, batches, LR, BETAS, EPS, grad_scale=N)):
            return (f"the gradients were summed across ranks, not averaged ({N}x too large; divide the "
                    f"reduce-scattered shard by {N}). Adam divides m by sqrt(v), so it hardly notices the scale: "
                    f"the error comes only through eps, which is why it is so small")
        if close(adam_serial(layers, batches, LR, BETAS, EPS, bias_correction=False)):
            return ("the bias correction is missing: divide m by 1 - beta1^t and v by 1 - beta2^t (t = 1 at the "
                    "first step), as torch.optim.Adam does")
        others = [r for r in range(len(got)) if r != rank and not torch.equal(flat(got[r]), mine)]
        if others:
            return (f"the ranks disagree: rank {rank}'s weights differ from rank {others[0]}'s, though every rank "
                    f"should end with the same all-gathered weights")
        return ""


SPEC = Zero()
