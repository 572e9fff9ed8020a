"""p8 ZeRO (stage 2): reduce-scatter the gradients, Adam on the local 1/N shard, all-gather the weights.

Three checks: the weights after k Adam steps (against torch.optim.Adam on the serial model), the optimizer state
a rank keeps between steps (the ledger, after every step, against K·Ψ/N bytes plus bookkeeping, an excess named
only by its size), and the bytes sent (at most data parallel's all-reduce volume).
Adam is almost invariant to the scale of the gradient, so a forgotten average changes the weights only through
eps: a small error, which the float64 comparison still sees and the diagnosis names. Wrong weights are named by
replaying the common mistakes of step() on the serial model (REPLAYED: the scale of the gradient, the bias
corrections, the place of eps, the learning rate twice, the weights gathered before the update), and a wrong shard
by what the optimizer held right after it was made (a slice of the initial weights at another offset).
"""

from __future__ import annotations

import torch

from puzzles.model import forward, init_layers, loss_fn, make_batch
from puzzles.sim import CostModel

from ...core import probe
from ...core.compare import safe_diagnosis
from ...core.result import Budget, Check, fmt
from ...core.rules import BOOKKEEPING_BYTES, communication_check, sized_like
from ...core.spec import Observation, PuzzleSpec, check_layers
from ..common.optimizer_state import dtype_counts, slices_of

N, B, D, H, L, K_STEPS = 4, 32, 32, 64, 2, 3
LR, BETAS, EPS = 0.01, (0.9, 0.999), 1e-8
PSI = 2 * L * D * H  # number of weights
BYTES = 8  # float64
STATE_BYTES_PER_WEIGHT = 3 * BYTES  # K: master + m + v, float64
COST = CostModel(latency_ticks=8, bytes_per_tick=512)
VECTOR = BYTES * PSI  # one full-size float64 vector: the flat weights or the flat gradient
SHARD = PSI // N  # the elements of one rank's shard
DATA_PARALLEL_BYTES = 2 * (N - 1) * VECTOR // N  # what a rank sends in one all-reduce of the gradients


def adam_serial(layers, batches, lr, betas, eps, grad_scale=1.0, bias_correction=True, eps_form="torch",
                lr_power=1, lagged=False):
    """k Adam steps of the serial model, one batch each: torch.optim.Adam's arithmetic, with knobs that make the
    common mistakes: a gradient `grad_scale` times the average; the bias correction missing (False) or its two
    factors swapped ("swapped"); eps inside the square root ("inside") or in the paper's ε̂ form ("hat": the
    corrections folded into the step size, eps added to sqrt(v)); the learning rate applied `lr_power` times
    (lr**2); and `lagged`, the weights gathered at the start of step(), before the update, so that the layers
    always hold the master weights of the step before."""
    ws = [w.detach().clone() for pair in layers for w in pair]
    master = [w.clone() for w in ws]
    m = [torch.zeros_like(w) for w in ws]
    v = [torch.zeros_like(w) for w in ws]
    beta1, beta2 = betas
    step_lr = lr ** lr_power
    for t, (x, target) in enumerate(batches, 1):
        params = [w.clone().requires_grad_() for w in ws]
        loss_fn(forward(x, list(zip(params[::2], params[1::2]))), target).backward()
        bc1, bc2 = (1 - beta1 ** t, 1 - beta2 ** t) if bias_correction else (1.0, 1.0)
        if bias_correction == "swapped":
            bc1, bc2 = bc2, bc1
        if lagged:
            ws = [w.clone() for w in master]
        for w, p, mi, vi in zip(master, params, m, v):
            g = p.grad * grad_scale
            mi.mul_(beta1).add_(g, alpha=1 - beta1)
            vi.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            if eps_form == "inside":
                w.addcdiv_(mi, (vi / bc2 + eps).sqrt(), value=-step_lr / bc1)
            elif eps_form == "hat":
                w.addcdiv_(mi, vi.sqrt() + eps, value=-step_lr * bc2 ** 0.5 / bc1)
            else:
                w.addcdiv_(mi, (vi / bc2).sqrt() + eps, value=-step_lr / bc1)
        if not lagged:
            ws = [w.clone() for w in master]
    return list(zip(ws[::2], ws[1::2]))


# The common mistakes of step(), replayed on the serial model: (adam_serial's knobs, what to say).
REPLAYED = (
    ({"grad_scale": N}, f"the gradients were summed across ranks, not averaged ({N}x too large; divide the "
                        f"reduce-scattered shard by {N}). Adam divides m by sqrt(v), so it hardly notices the scale: "
                        f"the error comes only through eps, which is why it is so small"),
    ({"grad_scale": 1 / N}, f"the gradients were divided by {N} twice ({N}x too small: divide the reduce-scattered "
                            f"sum by {N} once). Adam divides m by sqrt(v), so it hardly notices the scale: the error "
                            f"comes only through eps, which is why it is so small"),
    ({"bias_correction": False}, "the bias correction is missing: divide m by 1 - beta1^t and v by 1 - beta2^t (t = 1 "
                                 "at the first step), as torch.optim.Adam does"),
    ({"bias_correction": "swapped"}, "the two bias corrections are swapped: m was divided by 1 - beta2^t and v by "
                                     "1 - beta1^t. The first moment goes with beta1: m_hat = m / (1 - beta1^t), "
                                     "v_hat = v / (1 - beta2^t)"),
    ({"eps_form": "inside"}, "eps is inside the square root: torch.optim.Adam adds it after, "
                             "m_hat / (sqrt(v_hat) + eps)"),
    ({"eps_form": "hat"}, "eps is added to sqrt(v) with the bias corrections folded into the step size (the Adam "
                          "paper's ε̂ form, lr·sqrt(1 - beta2^t)/(1 - beta1^t)·m / (sqrt(v) + eps)): torch.optim.Adam "
                          "adds eps to sqrt(v / (1 - beta2^t)), which differs once eps matters. Use its form: "
                          "m_hat / (sqrt(v_hat) + eps)"),
    ({"lr_power": 2}, "the learning rate was applied twice (the step is lr² times m_hat / (sqrt(v_hat) + eps)): "
                      "multiply by lr once"),
    ({"lagged": True}, "the weights are one step behind: they were all-gathered at the start of step(), before the "
                       "update, so the layers hold the master weights of the step before (and every forward runs on "
                       "them). All-gather after updating the master shard"),
)


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
            master_at_start = slices_of(opt, [w for pair in layers for w in pair], SHARD)
            states = []  # what the rank holds between steps, beyond what it held before the optimizer existed
            for x, target in zip(xs, targets):
                loss = loss_fn(forward(x, layers), target)
                loss.backward()
                del loss
                opt.step()
                for pair in layers:
                    for w in pair:
                        w.grad = None
                states.append(probe.memory_now() - before)
            return {"layers": [(w1.detach(), w2.detach()) for w1, w2 in layers], "state_bytes": max(states),
                    "state_per_step": states, "state_dtypes": dtype_counts(opt), "master_at_start": master_at_start}

        return run

    def budgets(self, inputs):
        return {
            "optimizer state": Budget("optimizer state", f"K·Ψ/N + {BOOKKEEPING_BYTES:,} bytes, K = 24 (float64 "
                                      f"master 8 + m 8 + v 8; plus scalars such as a step counter)",
                                      STATE_BYTES_PER_WEIGHT * PSI // N + BOOKKEEPING_BYTES, "bytes"),
            "communication": Budget("communication", f"2(N-1)/N · 8Ψ bytes per step x k steps + "
                                    f"{BOOKKEEPING_BYTES:,} (an all-reduce of the gradients, plus scalars)",
                                    DATA_PARALLEL_BYTES * K_STEPS + BOOKKEEPING_BYTES, "bytes"),
        }

    def check(self, obs: Observation, ref, inputs):
        got = [r["layers"] for r in obs.results]
        budgets = self.budgets(inputs)
        diagnose = lambda bad: self.diagnose(bad, got, ref, inputs, obs)  # noqa: E731
        return [check_layers("weights after k steps", got, ref["layers"], f"weights after {K_STEPS} Adam steps",
                             diagnose),
                self.check_state(obs, budgets["optimizer state"]),
                self.check_state_dtype(obs),
                communication_check(obs, budgets["communication"], diagnose=self.diagnose_communication)]

    def check_state(self, obs: Observation, budget: Budget) -> Check:
        states = [r["state_bytes"] for r in obs.results]
        worst = max(range(len(states)), key=lambda r: states[r])
        s = states[worst]
        ok = s <= budget.value
        replicated = 2 * VECTOR
        message = (f"rank {worst} held up to {fmt(s, 'bytes')} of optimizer state between steps "
                   f"({s / PSI:.3g} bytes per weight, Ψ = {PSI:,}; after each step: "
                   f"{', '.join(f'{x:,}' for x in obs.results[worst]['state_per_step'])}), "
                   f"{'within' if ok else 'over'} the budget {budget.describe()}; replicated Adam would hold "
                   f"2·8·Ψ = {fmt(replicated, 'bytes')} of moments. Per rank: {', '.join(f'{x:,}' for x in states)}")
        return Check("optimizer state", ok, message, measured=s, budget=budget,
                     diagnosis="" if ok else safe_diagnosis(self.diagnose_state, worst, s, budget))

    @staticmethod
    def check_state_dtype(obs: Observation) -> Check:
        """The text's rule: the optimizer keeps its state in float64, as the weights are. (A moment kept in float32
        moves the weights by about 1e-9 after three steps, inside the weights' tolerance: only this check sees it.)"""
        for r, res in enumerate(obs.results):
            other = {d: n for d, n in (res.get("state_dtypes") or {}).items() if d != "float64"}
            if other:
                kinds = ", ".join(f"{n:,} numbers in {d}" for d, n in sorted(other.items()))
                return Check("state in float64", False,
                             f"rank {r}'s optimizer keeps {kinds} (in its attributes); the puzzle keeps the master "
                             f"copy, m and v in float64, as the weights are",
                             diagnosis=f"optimizer state kept in {', '.join(sorted(other))}: create the master copy, "
                                       f"m and v with dtype=torch.float64 (torch.zeros_like(master) follows the "
                                       f"master's dtype)")
        return Check("state in float64", True, "every rank's optimizer keeps its state in float64, as the weights are")

    @staticmethod
    def diagnose_state(rank, state, budget) -> str:
        """Name what outlived the step only when the bytes held single it out."""
        shard = VECTOR // N
        whole = sized_like(state, {"m and v": 2 * VECTOR, "master, m and v": 3 * VECTOR,
                                   "m and v (and a sharded master)": 2 * VECTOR + shard})
        if whole is not None:
            return (f"rank {rank} held exactly {whole} for every weight ({fmt(state, 'bytes')}): the whole Adam state "
                    f"is replicated, not this rank's 1/{N} slice of it. Keep master, m and v for the shard only")
        if sized_like(state - VECTOR, {"m, v": 2 * shard, "master, m, v": 3 * shard}):
            return (f"what rank {rank} held is the shards' state plus one full-size float64 vector (8Ψ = "
                    f"{fmt(VECTOR, 'bytes')}) that outlived the step. Is a shard a view of a flat buffer "
                    f"(`flat[lo:hi]` keeps all of `flat` alive: take `.clone()`), a master copy of all the weights, "
                    f"or a flat gradient or weight buffer kept as an attribute?")
        if sized_like(state - 2 * VECTOR, {"m, v": 2 * shard, "master, m, v": 3 * shard}):
            return (f"what rank {rank} held is the shards' state plus two full-size float64 vectors (2·8Ψ): flat "
                    f"buffers of the gradient and of the weights kept between steps?")
        if sized_like(state - shard, {"master, m, v": 3 * shard}):
            return (f"rank {rank} held one shard-size float64 vector (8Ψ/N = {fmt(shard, 'bytes')}) more than "
                    f"master, m and v: a gradient shard kept between steps (a parameter's .grad? set it to None "
                    f"after the update), or a fourth state vector?")
        return (f"rank {rank} held {state / shard:.2f} shard-size float64 vectors' worth (8Ψ/N = "
                f"{fmt(shard, 'bytes')}); master, m and v are 3 of them")

    @staticmethod
    def diagnose_communication(rank, by_kind) -> str:
        if by_kind.get("all_reduce", (0, 0))[1] >= DATA_PARALLEL_BYTES * K_STEPS:
            also = ", and the weights all-gathered on top" if any(k.startswith("all_gather") for k in by_kind) else ""
            return (f"the all-reduces alone sent as much as all-reducing the full gradients{also}: each rank needs "
                    f"only the average of its own shard of the gradient, which a reduce-scatter (half an all-reduce) "
                    f"gives it")
        return ""

    def diagnose(self, bad, got, ref, inputs, obs: Observation) -> str:
        """Name the likely mistake from the first rank whose weights are off."""
        rank = bad[0].meta[0]
        start = flat(inputs["layers"])
        mine = as_flat(got[rank], inputs["layers"])
        if mine is None or not torch.isfinite(mine).all():
            return ""  # not the weights' shapes, or not finite: the message says what
        narrow = [(e["kind"], e["nbytes"]) for e in obs.events_of(rank, "comm")
                  if e["kind"] != "recv" and e["nbytes"] in (4 * PSI, 4 * PSI // N)]
        if narrow:
            kind, nbytes = narrow[0]
            return (f"rank {rank}'s {kind} carried {nbytes:,} bytes, 4 bytes for each of its {nbytes // 4:,} numbers: "
                    f"float32. Keep the master copy, m, v and what the collectives carry in float64, as the weights")
        unchanged = (mine == start).double().mean().item()
        if unchanged > 0.99:
            return ("the weights did not change: copy the gathered weights into each w in place (w.copy_(...)), "
                    "not into a new tensor or a rebound name")
        pieces = [w.reshape(-1) for pair in got[rank] for w in pair]
        if all(torch.equal(piece, pieces[0]) for piece in pieces[1:]):
            return (f"every weight of rank {rank} holds the same numbers: each was copied from the same slice of the "
                    f"gathered vector. Is the offset advanced past each weight as the weights are filled?")
        lo, hi = rank * PSI // N, (rank + 1) * PSI // N
        outside = torch.cat([mine[:lo] == start[:lo], mine[hi:] == start[hi:]]).all().item()
        if outside and not torch.equal(mine[lo:hi], start[lo:hi]):
            return (f"rank {rank}'s own shard (elements {lo:,} to {hi - 1:,}) was updated and every other weight still "
                    f"holds its initial value: the updated shards were never all-gathered into the weights "
                    f"(all_gather_into_tensor, then copy into every w)")
        batches, layers = inputs["batches"], inputs["layers"]

        def close(candidate):
            expected = flat(candidate)
            return bool((mine - expected).abs().max() <= 1e-8 * max(1.0, expected.abs().max().item()))

        master = _wrong_master(obs.results[rank].get("master_at_start"), rank)
        if master:
            return master
        for knobs, text in REPLAYED:
            if close(adam_serial(layers, batches, LR, BETAS, EPS, **knobs)):
                return text
        others = [r for r in range(len(got)) if r != rank and not _same(as_flat(got[r], layers), mine)]
        if others:
            return (f"the ranks disagree: rank {rank}'s weights differ from rank {others[0]}'s, though every rank "
                    f"should end with the same all-gathered weights")
        return ""


def _wrong_master(found, rank: int) -> str:
    """What the optimizer held right after it was made says whether its master shard is the right slice: a tensor of
    Ψ/N initial weights that is a slice at another offset, or not one slice at all, when none is the right one."""
    if not found or any(f["offset"] == rank * SHARD for f in found):
        return ""
    shifted = next((f for f in found if f["offset"] is not None), None)
    if shifted is not None:
        return (f"a wrong shard offset: rank {rank}'s optimizer, when made, held elements {shifted['offset']:,} to "
                f"{shifted['offset'] + SHARD - 1:,} of the flat weights ({shifted['path']}), but rank {rank}'s shard is "
                f"elements r·Ψ/N = {rank * SHARD:,} to {(rank + 1) * SHARD - 1:,}, the slice whose gradient "
                f"reduce_scatter_tensor gives it")
    return (f"a wrong shard: rank {rank}'s optimizer, when made, held {found[0]['path']}, {SHARD:,} of the initial "
            f"weights but not one slice of the flat vector. Rank r's shard is elements r·Ψ/N to (r+1)·Ψ/N - 1 of the "
            f"weights flattened in order (layers[0].w1, layers[0].w2, ...), the slice whose gradient "
            f"reduce_scatter_tensor gives it")


def as_flat(layers, like) -> torch.Tensor | None:
    """The weights as one float64 vector, when they are tensors of the right shapes (else None)."""
    try:
        pairs = [tuple(pair) for pair in layers]
        if len(pairs) != len(like) or any(len(p) != 2 for p in pairs):
            return None
        ws = [w for pair in pairs for w in pair]
        if not all(isinstance(w, torch.Tensor) and w.shape == e.shape for w, e in zip(ws, (e for p in like for e in p))):
            return None
        return torch.cat([w.detach().double().reshape(-1) for w in ws])
    except TypeError:
        return None


def _same(a, b) -> bool:
    return a is not None and torch.equal(a, b)


SPEC = Zero()
