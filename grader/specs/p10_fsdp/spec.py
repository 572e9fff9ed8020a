"""p10 ZeRO-3 / FSDP: each layer all-gathered just before it computes, let go after, gathered again for the
backward, its gradient reduce-scattered; the next gather prefetched behind the current layer's compute.

Six rules, each measured as such: the shards after one SGD step against the serial step; the gathered buffers
alive at every collective (gathered_weights.py: storages, whatever views the answer holds); the bytes held beyond
the inputs at every collective of the forward (the ledger: copies of the weights cannot hide); each rank's FLOPs
(its 1/N share, nothing recomputed); the bytes sent, which must be ZeRO-3's volume exactly (fewer: a gather
skipped, the weights kept as ZeRO-2 keeps them); and the makespan on the simulated clock (the prefetch).
Wrong shards are named by the step they took, or by the order the rank gathered its layers in (the watch notes
which shard each gather carries). SGD, not Adam: the rules are about the weights and their gradients, and SGD shows every gradient mistake at full
size, where Adam's near scale-invariance hides a forgotten average (puzzle 8 has Adam and its state).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from puzzles.model import forward, init_layers, loss_fn, make_batch
from puzzles.sim import CostModel

from ...core.compare import safe_diagnosis, values_check
from ...core.result import Budget, Check, fmt
from ...core.rules import (BOOKKEEPING_BYTES, COMPUTE_CAP, communication_volume_check, compute_check,
                           exposed_communication, overlap_check, sent, slow_compute)
from ...core.spec import Observation, PuzzleSpec
from ..common.costs import Cost, copy, elementwise, measure
from .gathered_weights import describe_layers, layers_held, watched

N, L, B, D, H = 4, 4, 16, 64, 256
ROWS = B // N  # b: rows per rank
LR = 0.05
BYTES = 8  # float64
PSI = 2 * L * D * H  # weights
W = 2 * D * H * BYTES  # one layer's full weights
SHARDS = BYTES * PSI // N  # what a rank keeps of the model
ACT = ROWS * (2 * D + 2 * H) * BYTES  # room for one block's activations (x, x @ w1, its gelu) and its output
COST = CostModel(latency_ticks=8, bytes_per_tick=1024)
TOLERANCE_PERCENT = 5
DATA_PARALLEL_BYTES = 2 * (N - 1) * BYTES * PSI // N  # an all-reduce of every gradient
ZERO3_BYTES = 3 * (N - 1) * BYTES * PSI // N  # gather (forward), gather (backward), reduce-scatter
PRODUCT_FLOPS = 12 * ROWS * D * H * L  # the rank's matmuls: 2 per block forward and 4 backward, of 2·b·d·h each


def _layer_forward(x, w1, w2):
    """The puzzle's forward_keeping_activations, as its text gives it: what the budgets count."""
    a = x @ w1
    return x + F.gelu(a) @ w2, (x, a)


def _layer_backward(saved, w1, w2, grad_y):
    """The puzzle's backward_from_activations, as its text gives it."""
    x, a = saved
    cdf = 0.5 * (1 + torch.erf(a * 0.5 ** 0.5))
    pdf = torch.exp(-0.5 * a * a) * (2 * torch.pi) ** -0.5
    grad_w2 = (a * cdf).T @ grad_y
    grad_a = (grad_y @ w2.T) * (cdf + a * pdf)
    grad_w1 = x.T @ grad_a
    grad_x = grad_y + grad_a @ w1.T
    return grad_x, grad_w1, grad_w2


def _step_costs() -> tuple[Cost, Cost, Cost]:
    """(forward, backward, the rest) of one rank's step on the clock: L layers of the two helpers on its b rows;
    then the loss's gradient 2·(y - target)/b, each layer's gradients copied into one flat buffer for their
    reduce-scatter, and its shard updated (scale by lr/N, subtract: 2 FLOPs per element of the shard)."""
    x, w1, w2 = torch.ones(ROWS, D, dtype=torch.float64), torch.ones(D, H, dtype=torch.float64), \
        torch.ones(H, D, dtype=torch.float64)
    kept = {}
    forward = measure(COST, lambda: kept.setdefault("out", _layer_forward(x, w1, w2)))
    backward = measure(COST, lambda: _layer_backward(kept["out"][1], w1, w2, x))
    loss_grad = measure(COST, lambda: 2 * (x - x) / ROWS)
    shard = PSI // (N * L)
    rest = loss_grad + L * (copy(COST, 2 * D * H) + elementwise(COST, shard, 2) + elementwise(COST, shard, 3))
    return L * forward, L * backward, rest


FORWARD, BACKWARD, REST = _step_costs()
# Room for bookkeeping: one elementwise pass over every layer's weights or gradients (autograd, computing through
# views of the gathered buffer, adds the two views' gradients into one), and one on every block's [b, h] activation.
ALLOWANCE = PSI + L * ROWS * H


def flat_layer(w1, w2) -> torch.Tensor:
    return torch.cat([w1.detach().reshape(-1), w2.detach().reshape(-1)])


def serial_step(layers, x, target, lr, grad_scale=1.0):
    """One SGD step of the serial model on the whole batch: each layer's flat weights after it."""
    ws = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_()) for w1, w2 in layers]
    loss_fn(forward(x, ws), target).backward()
    return [flat_layer(w1, w2) - lr * grad_scale * flat_layer(w1.grad, w2.grad) for w1, w2 in ws]


def gather_ticks() -> int:
    return COST.comm_ticks("all_gather_into_tensor", W, N)


def compute_ticks() -> int:
    """The step's compute on one rank, on the clock (_step_costs)."""
    return (FORWARD + BACKWARD + REST).ticks


class Fsdp(PuzzleSpec):
    id, name, title = "p10", "fsdp", "ZeRO-3 / FSDP (prefetch)"
    entries = ("fsdp_step",)
    world_size = N
    cost = COST
    simulator_only = ("makespan",)
    hints = (("Gather into two buffers in turn: wait for layer j's gather, launch layer j+1's (async_op=True), "
              "then compute layer j. The layers are used in the order 0..L-1, L-1..0; reduce-scatter each layer's "
              "flat gradient asynchronously and update its shard after waiting."),)

    def make_inputs(self, seed):
        x, target = make_batch(B, D, seed)
        return {"layers": init_layers(L, D, H, seed + 1, requires_grad=False), "x": x, "target": target}

    def reference(self, inputs):
        after = serial_step(inputs["layers"], inputs["x"], inputs["target"], LR)
        return {"shards": [[layer.chunk(N)[r] for layer in after] for r in range(N)]}

    def launch(self, inputs):
        flats = [flat_layer(w1, w2) for w1, w2 in inputs["layers"]]
        per_rank = [([f.chunk(N)[r].clone() for f in flats], xs, ts)
                    for r, (xs, ts) in enumerate(zip(inputs["x"].chunk(N), inputs["target"].chunk(N)))]
        return (LR,), per_rank

    def program(self, module):
        step = module.fsdp_step

        def run(dist, lr, shards, x, target):
            mine = list(shards)  # the tensors handed over, updated in place: what the grader reads
            watch, records = watched(dist, shards, W)
            step(watch, shards, x, target, lr)
            return {"shards": [s.detach() for s in mine], "held": records.held}

        return run

    def budgets(self, inputs):
        c, a = compute_ticks(), gather_ticks()
        t = c * TOLERANCE_PERCENT // 100
        return {
            "gathered weights": Budget("gathered weights", f"8Ψ/N + 2·W + {BOOKKEEPING_BYTES:,} bytes (your shards, "
                                       f"the layer computing and the layer prefetched; W = 2·d·h·8 = {W:,})",
                                       SHARDS + 2 * W + BOOKKEEPING_BYTES, "bytes"),
            "forward memory": Budget("forward memory", f"2·W + (L + 2)·Act + {BOOKKEEPING_BYTES:,} bytes (two "
                                     f"layers' weights; L blocks' activations and two more for temporaries, "
                                     f"Act = b·(2d+2h)·8 = {ACT:,})", 2 * W + (L + 2) * ACT + BOOKKEEPING_BYTES,
                                     "bytes"),
            "compute": Budget("compute", f"the rank's 1/N share of the serial step, every op counted: L layers of "
                              f"forward_keeping_activations and backward_from_activations on its b rows "
                              f"({(FORWARD + BACKWARD).flops:,}), the loss's gradient and its shards' update "
                              f"({REST.flops:,}), + Ψ + L·b·h for bookkeeping",
                              (FORWARD + BACKWARD + REST).flops + ALLOWANCE, "count"),
            "communication": Budget("communication", f"3·(N-1)/N·8Ψ + {BOOKKEEPING_BYTES:,} bytes (two gathers and "
                                    f"one reduce-scatter of every layer)", ZERO3_BYTES + BOOKKEEPING_BYTES, "bytes"),
            "makespan": Budget("makespan", f"communication left exposed, makespan - min(work, 1.25·C), at most "
                               f"2·A + T = one gather and one reduce-scatter {2 * a:,} + tolerance "
                               f"{TOLERANCE_PERCENT}%·C {t:,} ticks (C = {c:,}, the step's compute)", 2 * a + t,
                               "ticks"),
        }

    def check(self, obs: Observation, ref, inputs):
        budgets = self.budgets(inputs)
        return [self.check_values(obs, ref, inputs),
                self.check_gathered(obs, budgets["gathered weights"]),
                self.check_forward_memory(obs, budgets["forward memory"]),
                compute_check(obs, budgets["compute"], self.diagnose_compute,
                              least=PRODUCT_FLOPS - 2 * ROWS * D * H),
                communication_volume_check(obs, budgets["communication"], ZERO3_BYTES,
                                           diagnose=self.diagnose_communication),
                overlap_check(obs, budgets["makespan"], compute_ticks(), self.cost.device, self.diagnose_makespan)]

    def check_values(self, obs: Observation, ref, inputs) -> Check:
        pairs = []
        for r, res in enumerate(obs.results):
            got = res.get("shards") if isinstance(res, dict) else None
            got = got if isinstance(got, (list, tuple)) else []
            for i, expected in enumerate(ref["shards"][r]):
                pairs.append((f"rank {r}: shards[{i}] (layer {i})", got[i] if i < len(got) else None, expected, (r, i)))
        return values_check("weights after the step", pairs, "shards after one SGD step",
                            lambda bad: self.diagnose_values(bad, inputs, obs))

    @staticmethod
    def diagnose_values(bad, inputs, obs: Observation) -> str:
        """Name the mistake from the first shard that is off, by the step it took, or by the layers its rank
        gathered."""
        rank, i = bad[0].meta
        got, expected = bad[0].got, bad[0].expected
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape or got.dtype != expected.dtype or \
                not torch.isfinite(got).all():
            return ""
        order = gather_order(obs.results[rank])
        if order is not None:
            return order
        start = flat_layer(*inputs["layers"][i]).chunk(N)[rank]
        if torch.equal(got, start):
            return (f"rank {rank}'s shard of layer {i} is unchanged: update the shards in place "
                    f"(shards[i] -= lr · gradient shard)")
        step, wanted = got - start, expected - start
        k = (step @ wanted / (wanted @ wanted)).item() if wanted.abs().max() > 0 else 0.0
        if (step - k * wanted).abs().max() <= 1e-8 * max(1.0, wanted.abs().max().item()):
            if abs(k - N) < 1e-6:
                return (f"the step is {N} times too large: reduce_scatter_tensor sums the ranks' gradients; divide "
                        f"by N = {N} for the average")
            if abs(k - 1 / N) < 1e-6:
                return (f"the step is {N} times too small: the gradient shard was averaged twice, or the loss's "
                        f"gradient divided by the whole batch (N·b = {N * ROWS} rows) instead of this rank's "
                        f"b = {ROWS}: d loss/dy = 2·(y - target)/b on this rank's rows, and the reduce-scatter's sum "
                        f"divided by N averages it")
            if abs(k - 1 / 2) < 1e-6:
                return ("the step is exactly half the serial one: the loss's gradient is d loss/dy = "
                        "2·(y - target)/b, the squared error's derivative: was the 2 left out?")
        return ""

    def check_gathered(self, obs: Observation, budget: Budget) -> Check:
        worst = [max((h["gathered"] for h in res["held"]), default=SHARDS) for res in obs.results]
        over = [r for r in range(N) if worst[r] > budget.value]
        r = over[0] if over else max(range(N), key=worst.__getitem__)
        ok = not over
        counts = layers_held(obs.results[r]["held"], SHARDS, W)
        message = (f"rank {r} held at most {fmt(worst[r], 'bytes')} of shards and gathered weights at its "
                   f"collectives, {'within' if ok else 'over'} the budget {budget.describe()}. Gathered layers "
                   f"alive at each of its {len(counts)} collectives: {describe_layers(counts) or 'none'}")
        diagnosis = "" if ok else safe_diagnosis(self.diagnose_gathered, counts)
        return Check("gathered weights", ok, message, measured=worst[r], budget=budget, diagnosis=diagnosis)

    @staticmethod
    def diagnose_gathered(counts) -> str:
        if counts and counts[0] >= L - 0.01:
            return (f"all {L} layers were gathered at the first collective: gather each layer just before its "
                    f"forward (and again before its backward)")
        rising = [b - a for a, b in zip(counts, counts[1:L])]
        if len(rising) >= 2 and all(abs(s - 1) < 0.01 for s in rising):
            return ("one more gathered layer was alive at every gather of the forward: each layer's weights were "
                    "kept after its forward (for the backward?). Let a layer's buffer go after its compute, and "
                    "gather it again for the backward")
        if abs(max(counts) - 3) < 0.01:
            return ("three layers' weights were alive at once: let a layer's buffer go (del, or rebind every name "
                    "that holds it) before launching the gather after next, and prefetch one layer ahead, not two")
        return ""

    def check_forward_memory(self, obs: Observation, budget: Budget) -> Check:
        worst = [max((h["beyond"] for h in res["held"] if h["forward"]), default=0) for res in obs.results]
        over = [r for r in range(N) if worst[r] > budget.value]
        r = over[0] if over else max(range(N), key=worst.__getitem__)
        ok = not over
        message = (f"at its collectives before the first reduce-scatter of a layer's gradient, rank {r} held at most "
                   f"{fmt(worst[r], 'bytes')} beyond its inputs ({worst[r] / W:.2f}·W), "
                   f"{'within' if ok else 'over'} the budget {budget.describe()}")
        diagnosis = ""
        if not ok:
            gathered = max(h["gathered"] for h in obs.results[r]["held"]) - SHARDS
            diagnosis = safe_diagnosis(self.diagnose_forward_memory, worst[r], gathered)
        return Check("forward memory", ok, message, measured=worst[r], budget=budget, diagnosis=diagnosis)

    @staticmethod
    def diagnose_forward_memory(held, gathered) -> str:
        if gathered > 2 * W + BOOKKEEPING_BYTES:
            return "the gathered buffers alone are over their budget (see gathered weights)"
        extra = held - 2 * W - (L + 2) * ACT
        return (f"beyond two layers' gathered buffers and the activations, the forward held about {extra / W:.1f} "
                f"layers' worth of other memory: copies of the gathered weights (.clone(), .contiguous(), "
                f"torch.cat of the views) kept alive? Compute with views of the gathered buffer")

    @staticmethod
    def diagnose_compute(rank, fwd, bwd) -> str:
        extra = fwd + bwd - (FORWARD + BACKWARD + REST).flops
        sizes = {"one more forward of every block (recomputation)": FORWARD.flops,
                 "x @ w1 again for every block": L * 2 * ROWS * D * H}
        hits = [what for what, n in sizes.items() if abs(extra - n) <= ALLOWANCE]
        name = hits[0] if len(hits) == 1 else None
        if name:
            return (f"rank {rank} computed {name}: the activations the forward kept are all the backward needs "
                    f"(backward_from_activations)")
        return ""

    @staticmethod
    def diagnose_communication(rank, by_kind) -> str:
        gathered = sum(b for k, (_, b) in by_kind.items() if k.startswith("all_gather") or k == "broadcast")
        if by_kind.get("all_reduce", (0, 0))[1] >= DATA_PARALLEL_BYTES:
            return ("the gradients were all-reduced (2·(N-1)/N of their bytes): each rank needs only its shard of "
                    "each layer's gradient, which reduce_scatter_tensor gives it for half the bytes")
        if gathered < 2 * (N - 1) * BYTES * PSI // N - BOOKKEEPING_BYTES:
            return (f"rank {rank} gathered {gathered / (BYTES * PSI):.2f} x the model's bytes' worth ((N-1)/N of "
                    f"each layer per gather): ZeRO-3 gathers every layer twice, before its forward and again before "
                    f"its backward. Keeping the forward's weights for the backward is ZeRO-2's memory")
        return ""

    @staticmethod
    def diagnose_makespan(obs: Observation) -> str:
        """Which collectives ran while rank 0 computed nothing."""
        if exposed_communication(obs, compute_ticks())[0] > compute_ticks() * COMPUTE_CAP[0] // COMPUTE_CAP[1]:
            return slow_compute(obs, compute_ticks())
        if max(sum(b for _, b in sent(obs, r).values()) for r in range(obs.world_size)) > ZERO3_BYTES + \
                BOOKKEEPING_BYTES:
            return "the ranks sent more than ZeRO-3's volume (see communication), and it took longer"
        compute = sorted(obs.events_of(0, "compute"), key=lambda e: e["start"])
        comm = [e for e in obs.events_of(0, "comm") if e["nbytes"] >= W // 2]
        if not compute or not comm:
            return ""

        def hidden(e) -> bool:  # some compute ran while this collective did
            return any(c["start"] < e["end"] and e["start"] < c["end"] for c in compute)

        gathers = [e for e in comm if e["kind"] in ("all_gather_into_tensor", "all_gather", "broadcast")]
        reduces = [e for e in comm if e not in gathers]
        exposed_g = sum(not hidden(e) for e in gathers[1:])
        exposed_r = sum(not hidden(e) for e in reduces[:-1])
        if exposed_g >= 2:
            return (f"{exposed_g} of rank 0's {len(gathers)} gathers ran while it computed nothing: launch each "
                    f"layer's gather with async_op=True before computing the layer before it (prefetch), and wait "
                    f"for it only when that layer starts")
        if exposed_r >= 2:
            return (f"{exposed_r} of rank 0's reduce-scatters ran while it computed nothing: launch them with "
                    f"async_op=True and wait for each after the next layer's backward")
        return ""


def gather_order(res) -> str | None:
    """What the order a rank gathered its layers in says, when it is a wrong order of the right number of gathers
    (each layer twice, as it is used: 0..L-1, L-1..0), else None."""
    used = [*range(L), *reversed(range(L))]
    got = [h["layer"] for h in res.get("held", []) if h.get("layer") is not None] if isinstance(res, dict) else []
    if len(got) != len(used) or got == used:
        return None
    shown = f"the layers were gathered in the order {got}, where they are used in the order {used}"
    if got[1:] == used[:-1] or got[:-1] == used[1:]:
        which = "the layer just used" if got[1:] == used[:-1] else "the layer after next"
        return (f"{shown}: every gather fetched {which} instead of the next one, so each layer computed with another "
                f"layer's weights: the prefetch is one layer off (gather the layer at position j + 1 of that order "
                f"while the one at j computes)")
    times = [got.count(i) for i in range(L)]
    often = "; " + ", ".join(f"layer {i} {n} times" for i, n in enumerate(times) if n != 2) if times != [2] * L else ""
    return f"{shown}{often}: some layer computed with another layer's weights"


SPEC = Fsdp()
