"""p3 data parallel: one SGD step, gradients averaged across ranks by all-reduce.

The rules, each measured as such: the updated weights (every rank, against the full-batch serial step), the
gradients left in w.grad (every rank, the average of the ranks' gradients: averaging the weights after a local
step gives the same weights for one SGD step, but not the gradients an optimizer reads), each rank's compute (1/N
of the serial step: its own rows, not the gathered batch), and the bytes each rank sends (no more than an
all-reduce of every gradient, whatever collectives carry them). What is left in w.grad also tells a summed
gradient from a scaled learning rate.
"""

from __future__ import annotations

import torch

from puzzles.model import forward, init_layers, loss_fn, make_batch
from puzzles.sim import CostModel

from ...core import probe
from ...core.compare import ratio, values_check
from ...core.result import Budget, Check
from ...core.rules import BOOKKEEPING_BYTES, communication_check, compute_check, product_flops, sent
from ...core.spec import Observation, PuzzleSpec, check_layers, pair_at
from ..common.costs import ZERO, block_costs, elementwise, loss_costs

N, B, D, H, L, LR = 4, 32, 64, 256, 4, 0.1
ROWS = B // N  # b: rows per rank
GRADIENT_BYTES = 2 * L * D * H * 8
ALL_REDUCE_BYTES = 2 * (N - 1) * GRADIENT_BYTES // N  # what each rank sends in an all-reduce of every gradient
PSI = 2 * L * D * H  # the model's weights (elements)
COST = CostModel()
# One rank's forward and backward on its b rows, every op counted (common/costs.py): L blocks forward; their backward, block
# 0 without the gradient of the batch (3 matmuls, no add); the loss on the b rows, forward and backward.
_BLOCK, _FIRST_BACKWARD = block_costs(ROWS, D, H, COST), block_costs(ROWS, D, H, COST, input_grad=False)[1]
FORWARD_BACKWARD = L * _BLOCK[0] + _FIRST_BACKWARD + (L - 1) * _BLOCK[1] + sum(loss_costs(ROWS, D, COST), ZERO)
# Every rank updates every weight: average (in place), scale by lr, subtract (in place), one FLOP each per element.
UPDATE = 2 * L * (elementwise(COST, D * H, 2) + elementwise(COST, D * H, 2) + elementwise(COST, D * H, 3))
UPDATE_FLOPS = UPDATE.flops  # 3Ψ
ALLOWANCE = L * ROWS * D  # room for bookkeeping: one elementwise op on every block's [b, d] activation
SHARE_FLOPS = FORWARD_BACKWARD.flops + UPDATE_FLOPS + ALLOWANCE
PRODUCT_FLOPS = 12 * ROWS * D * H * L  # the rank's matmuls: per block 2 forward and 4 backward of 2·b·d·h FLOPs
LEAST_FLOPS = PRODUCT_FLOPS - 2 * ROWS * D * H  # the same without the batch's own gradient (block 0's x @ w1)


def sgd_step(layers, x, target, lr):
    """The serial reference: one SGD step on (x, target); returns the new weights and the gradients."""
    layers = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_()) for w1, w2 in layers]
    loss_fn(forward(x, layers), target).backward()
    new = [(w1.detach() - lr * w1.grad, w2.detach() - lr * w2.grad) for w1, w2 in layers]
    return new, [(w1.grad, w2.grad) for w1, w2 in layers]


def _detached(t):
    return t.detach() if isinstance(t, torch.Tensor) else t


def _close(got, expected) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == expected.shape and got.dtype == expected.dtype
            and bool(torch.allclose(got, expected, rtol=1e-8, atol=1e-12)))


def another_weights(values: torch.Tensor, mean_grads, own) -> str | None:
    """The name of the weight, other than `own` (layer, 0 for w1 or 1 for w2), whose averaged gradient `values`
    equals number for number (read flat, whatever the shapes), or None."""
    flat = values.detach().reshape(-1)
    for i, pair in enumerate(mean_grads):
        for k, g in enumerate(pair):
            if (i, k) != own and g.numel() == flat.numel() and _close(flat, g.reshape(-1)):
                return f"layers[{i}].{('w1', 'w2')[k]}"
    return None


class DataParallel(PuzzleSpec):
    id, name, title = "p3", "data_parallel", "Data parallel"
    entries = ("data_parallel_step",)
    world_size = N
    cost = COST
    probes_hooks = False  # p7: does a backward after the step still fire hooks the step registered?
    hints = ("Average, don't add: the loss is a mean over the rows, so the full-batch gradient is the mean of "
             "the ranks' gradients.",)

    def make_inputs(self, seed):
        x, target = make_batch(B, D, seed)
        return {"layers": init_layers(L, D, H, seed + 1), "x": x, "target": target, "lr": LR}

    def reference(self, inputs):
        new, grads = sgd_step(inputs["layers"], inputs["x"], inputs["target"], inputs["lr"])
        shards = zip(inputs["x"].chunk(N), inputs["target"].chunk(N))
        local = [sgd_step(inputs["layers"], xs, ts, inputs["lr"]) for xs, ts in shards]
        return {"layers": new, "grads": grads, "local_layers": [new for new, _ in local],
                "local_grads": [grads for _, grads in local]}

    def launch(self, inputs):
        shards = list(zip(inputs["x"].chunk(N), inputs["target"].chunk(N)))
        return (inputs["layers"], inputs["lr"]), shards

    def program(self, module):
        step = getattr(module, self.entries[0])  # p7 grades its overlapped step the same way

        def run(dist, layers, lr, x_shard, target_shard):
            step(dist, x_shard, target_shard, layers, lr)
            pairs = [pair if isinstance(pair, (tuple, list)) and len(pair) == 2 else (pair, None) for pair in layers]
            out = {"layers": [(_detached(w1), _detached(w2)) for w1, w2 in pairs],
                   "grads": [tuple(_detached(getattr(w, "grad", None)) for w in pair) for pair in pairs]}
            if self.probes_hooks:  # after the results are taken: the probe leaves every w.grad None
                out["hooks"] = probe.hooks_that_fire([w for pair in pairs for w in pair])
            return out

        return run

    def budgets(self, inputs):
        return {
            "compute": Budget("compute", f"FB + 3Ψ + L·b·d: the forward and backward on the rank's own b = B/N "
                              f"rows, FB = {FORWARD_BACKWARD.flops:,} (1/N of the serial step's: per block 2 forward "
                              f"and 4 backward matmuls of 2·b·d·h, gelu, the residual add; the loss), the update of "
                              f"every weight, 3Ψ = {UPDATE_FLOPS:,} (average, scale, subtract: every rank updates "
                              f"all Ψ = 2·L·d·h weights), and L·b·d = {ALLOWANCE:,} for bookkeeping",
                              SHARE_FLOPS, "count"),
            "communication": Budget("communication", f"2(N-1)/N·G + {BOOKKEEPING_BYTES:,} bytes (an all-reduce of "
                                    f"every gradient, G = 2·L·d·h·8 bytes, plus scalars)",
                                    ALL_REDUCE_BYTES + BOOKKEEPING_BYTES, "bytes"),
        }

    def check(self, obs: Observation, ref, inputs):
        got = [r["layers"] for r in obs.results]
        budgets = self.budgets(inputs)
        diagnose = lambda bad: self.diagnose(bad, obs, ref, inputs)  # noqa: E731
        weights = check_layers("updated weights", got, ref["layers"], "updated weights", diagnose)
        return [weights,
                self.check_gradients(obs, ref, weights.passed),
                compute_check(obs, budgets["compute"], lambda r, f, b: self.diagnose_compute(obs, r, f, b),
                              least=LEAST_FLOPS),
                communication_check(obs, budgets["communication"], diagnose=self.diagnose_communication)]

    # ---- the gradients left in w.grad

    def expected_gradient(self, got, mean: torch.Tensor) -> torch.Tensor:
        """What w.grad must hold after the step: the average over the ranks (p7 admits the sum too)."""
        return mean

    def gradient_pairs(self, obs: Observation, ref) -> list:
        pairs = []
        for rank, res in enumerate(obs.results):
            grads = res.get("grads") if isinstance(res, dict) else None
            for i, mean in enumerate(ref["grads"]):
                got = pair_at(grads, i)
                for k, name in enumerate(("w1", "w2")):
                    pairs.append((f"rank {rank}: layers[{i}].{name}.grad", got[k],
                                  self.expected_gradient(got[k], mean[k]), (rank, i, k)))
        return pairs

    def check_gradients(self, obs: Observation, ref, weights_right: bool) -> Check:
        return values_check("averaged gradients", self.gradient_pairs(obs, ref), "gradients left in w.grad",
                            lambda bad: self.diagnose_gradients(bad, obs, ref, weights_right))

    def diagnose_gradients(self, bad, obs: Observation, ref, weights_right: bool) -> str:
        """Name what w.grad holds, when it is the rank's own gradient or a multiple of the average."""
        rank, i, k = bad[0].meta
        got = bad[0].got
        if got is None:
            return ("w.grad is None after the step: leave the averaged gradient in w.grad, where an optimizer "
                    "reads it (the step is w -= lr * w.grad)")
        if all(_close(m.got, ref["local_grads"][m.meta[0]][m.meta[1]][m.meta[2]]) for m in bad):
            if weights_right:
                return (f"the weights are right, but w.grad still holds each rank's own gradient ({bad[0].label} "
                        f"is rank {rank}'s local one): were the weights averaged instead of the gradients (a "
                        f"local step, then an all-reduce of the weights: the same weights after one plain SGD "
                        f"step, not with momentum or Adam), or was the average taken in a copy or a flat bucket and "
                        f"never written back into w.grad? Average the gradients themselves, in w.grad")
            return (f"w.grad still holds each rank's own gradient ({bad[0].label} is rank {rank}'s local one): "
                    f"the gradients in w.grad were never all-reduced")
        other = another_weights(got, ref["grads"], (i, k)) if isinstance(got, torch.Tensor) else None
        if other is not None:
            return (f"{bad[0].label} holds the averaged gradient of {other} (its numbers, in this weight's shape): a "
                    f"slice of a flat bucket read at another weight's offset. Is the offset advanced past each weight?")
        f = ratio(got, ref["grads"][i][k])
        if f is not None and abs(f - N) < 1e-6:
            return (f"w.grad holds {N}x the average, the sum over the ranks: divide it by dist.get_world_size() "
                    f"(after wait() for an async all-reduce)")
        if f is not None and abs(f - 1 / N) < 1e-6:
            return f"w.grad holds 1/{N} of the average: the gradient was divided by {N} twice"
        if f is not None:
            return f"{bad[0].label} is exactly {f:.6g}x the averaged gradient"
        if isinstance(got, torch.Tensor) and got.shape == ref["grads"][i][k].shape:
            return self.diagnose_float32(got.detach().double(), ref["grads"][i][k], obs)
        return ""

    @staticmethod
    def diagnose_compute(obs: Observation, rank, fwd, bwd) -> str:
        """From the rank's products (the batch rows it ran) and, when those are its share, the rest."""
        products = product_flops(obs, rank)
        if products >= (N - 0.5) * PRODUCT_FLOPS:
            return (f"rank {rank} ran {products / PRODUCT_FLOPS:.2f}x its share of the matmuls: as much as the "
                    f"serial step on the whole batch, or more. Each rank computes on its own {ROWS} rows only; the "
                    f"ranks share their gradients, not their inputs")
        if products <= PRODUCT_FLOPS:
            excess = fwd + bwd - SHARE_FLOPS
            gathered = any(e["kind"].startswith("all_gather") for e in obs.events_of(rank, "comm"))
            why = (": averaging all-gathered copies of every gradient on the rank? An all_reduce sums them inside "
                   "the collective" if gathered else "")
            return (f"rank {rank}'s matmuls were its share, but it computed {excess:,} FLOPs more than the step "
                    f"needs in elementwise ops and reductions, {excess / PSI:.1f} passes over the Ψ = {PSI:,} "
                    f"weights beyond the update's three{why}")
        return (f"rank {rank} ran {products / PRODUCT_FLOPS:.2f}x its share of the matmuls: one forward and one "
                f"backward on its own rows is all the step needs")

    @staticmethod
    def diagnose_communication(rank, by_kind) -> str:
        reduced = by_kind.get("all_reduce", (0, 0))[1]
        others = sorted(k for k in by_kind if k != "all_reduce")
        if reduced >= 2 * ALL_REDUCE_BYTES - BOOKKEEPING_BYTES:
            return (f"the all-reduces alone sent {reduced / ALL_REDUCE_BYTES:.2f}x an all-reduce of every gradient: "
                    f"some gradient was all-reduced more than once (a hook registered twice, or all-reduced in a "
                    f"hook and again after backward?)")
        if others:
            return (f"rank {rank} used {', '.join(others)}, which sent more than the gradients' sum needs: averaging "
                    f"the gradients takes an all_reduce (or a reduce_scatter_tensor then an all_gather_into_tensor, "
                    f"which send the same bytes)")
        return ""

    def diagnose(self, bad, obs: Observation, ref, inputs) -> str:
        """Name the likely mistake from the first mismatching weight's update, and from what w.grad holds."""
        results = obs.results
        rank, index, which = bad[0].meta
        k = 0 if which == "w1" else 1
        w0 = inputs["layers"][index][k].detach()
        got = bad[0].got
        if not isinstance(got, torch.Tensor) or got.shape != w0.shape or got.dtype != w0.dtype:
            return ""  # the message says what it is
        delta = got - w0
        if delta.abs().max() == 0:
            return ("the weights did not change: update them in place (`w -= lr * w.grad` under torch.no_grad()), "
                    "not by rebinding a name")
        grads = results[rank].get("grads") or []
        pair = grads[index] if index < len(grads) else None
        grad = pair[k] if isinstance(pair, (tuple, list)) and len(pair) == 2 else None
        mean = ref["grads"][index][k]
        f = ratio(delta, ref["layers"][index][k] - w0)
        if f is not None and abs(f - N) < 1e-6:
            if _close(grad, N * mean):
                return (f"the update is exactly {N}x too large, and w.grad holds {N}x the mean gradient: the "
                        f"gradients were summed across ranks, not averaged (divide by dist.get_world_size(), after "
                        f"wait() for an async all-reduce)")
            if _close(grad, mean):
                return (f"w.grad holds the averaged gradient, but the update is exactly {N}x too large: the update "
                        f"multiplies by {N} (the learning rate scaled by the world size?)")
            return (f"the update is exactly {N}x too large: the gradients summed across ranks and not averaged, or "
                    f"the learning rate scaled by {N}")
        if f is not None and abs(f - 1 / N) < 1e-6:
            if _close(grad, mean / N):
                return f"the update is exactly {N}x too small, and so is w.grad: the gradients were divided by {N} twice"
            if _close(grad, mean):
                return (f"w.grad holds the averaged gradient, but the update is exactly {N}x too small: the update "
                        f"divides by {N} once more (the gradient divided by {N} twice, or the learning rate by {N})")
            return (f"the update is exactly {N}x too small: the gradients divided by {N} twice, or the learning rate "
                    f"divided by {N}")
        other = another_weights(-delta / inputs["lr"], ref["grads"], (index, k))
        if other is not None:
            return (f"{bad[0].label} moved by the averaged gradient of {other} (its numbers, in this weight's shape): "
                    f"a slice of a flat bucket read at another weight's offset. Is the offset advanced past each "
                    f"weight?")
        local = ref["local_layers"][rank][index][k] - w0
        if torch.allclose(delta, local, rtol=1e-8, atol=1e-12):
            if _close(grad, mean):
                return (f"rank {rank} stepped with its own local gradient, although w.grad ends up averaged: it "
                        f"updated before the all-reduce's result was there (before wait()?), or from a copy")
            return (f"rank {rank} stepped with its own local gradient: the gradients were never all-reduced, or "
                    f"the result was never used (all-reduced a copy? updated before wait()?)")
        if f is not None:
            return f"the update of {bad[0].label} is exactly {f:.6g}x the serial one"
        own = ratio(delta, local)
        if own is not None and abs(own - 1 / N) < 1e-6:
            return (f"{bad[0].label} moved by rank {rank}'s own gradient divided by {N}: that gradient was divided by "
                    f"the world size but never all-reduced (was its all-reduce, or the hook that issues it, left "
                    f"out for this weight?)")
        return self.diagnose_float32(delta, ref["layers"][index][k] - w0, obs)

    @staticmethod
    def diagnose_float32(delta, expected, obs: Observation) -> str:
        """A float32 all-reduce: the update off by about float32's rounding, and every rank's all-reduces sent
        exactly half of a float64 all-reduce of the gradients. Both, or nothing."""
        off = ((delta - expected).abs().max() / expected.abs().max().clamp_min(1e-300)).item()
        halves = all(sent(obs, r).get("all_reduce", (0, 0))[1] == ALL_REDUCE_BYTES // 2 for r in range(N))
        if not (1e-10 < off < 1e-5 and halves):
            return ""
        return (f"the updates are off by about float32's rounding ({off:.1e} of the largest update) and every rank's "
                f"all-reduces sent exactly half the bytes of a float64 all-reduce of the gradients: the gradients "
                f"were communicated in float32. Reduce them in float64, the dtype of the weights")


SPEC = DataParallel()
