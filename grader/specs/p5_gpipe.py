"""p5 pipeline parallel (GPipe): p stages, m microbatches, all forwards then all backwards.

`PipelineSpec` here is shared with p6 (1F1B): same model cut, inputs, reference, gradient checks, bubble check and
diagnoses; p6 adds the stage-0 activation-memory budget.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from puzzles.model import forward, init_layers, loss_fn, make_batch
from puzzles.sim import CostModel

from ..core.compare import ratio, values_check
from ..core.result import Budget, Check, fmt
from ..core.spec import Observation, PuzzleSpec

P, M, B, D, H, L = 4, 8, 64, 64, 256, 8
PER = L // P  # blocks per stage
MB = B // M  # rows per microbatch
COST = CostModel(flops_per_tick=1024, latency_ticks=0, bytes_per_tick=4096)
F_TICKS = COST.compute_ticks(2 * MB * D * H) * 2 * PER  # one stage's forward of one microbatch: 1,024 ticks
TOLERANCE = Fraction(1, 200)  # half a percentage point above (p-1)/(m+p-1), for the 1-tick messages


def stage_of(layers, rank):
    return layers[rank * PER:(rank + 1) * PER]


def stage_vjp(stage_layers, a, g):
    """(gradient of the stage input, [(w1 grad, w2 grad)]) of one stage at input rows `a`, backpropagating the
    output gradient `g`."""
    layers = [(w1.detach().requires_grad_(), w2.detach().requires_grad_()) for w1, w2 in stage_layers]
    a = a.detach().requires_grad_()
    y = forward(a, layers)
    ws = [w for pair in layers for w in pair]
    grads = torch.autograd.grad(y, [a, *ws], g)
    return grads[0], [(grads[1 + 2 * j], grads[2 + 2 * j]) for j in range(len(layers))]


class PipelineSpec(PuzzleSpec):
    """What p5 and p6 share. Subclasses set id, name, title, entries and hints."""

    world_size = P
    cost = COST
    schedule = "GPipe"
    simulator_only = ("bubble",)  # idle time on the simulated clock

    def make_inputs(self, seed):
        x, target = make_batch(B, D, seed)
        return {"layers": init_layers(L, D, H, seed + 1), "x": x, "target": target}

    def reference(self, inputs):
        """The serial step, cut at the stage boundaries: each stage's input (for the whole batch), the gradient of
        the loss at each boundary, and every block's weight gradient."""
        layers = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_())
                  for w1, w2 in inputs["layers"]]
        acts, outs = [], []
        a = inputs["x"].detach().clone()
        for r in range(P):
            a = a.detach().requires_grad_()
            acts.append(a)
            a = forward(a, stage_of(layers, r))
            outs.append(a)
        loss = loss_fn(outs[-1], inputs["target"])
        loss.backward()
        for r in reversed(range(P - 1)):
            outs[r].backward(acts[r + 1].grad)
        return {"grads": [(w1.grad, w2.grad) for w1, w2 in layers], "acts": [a.detach() for a in acts],
                "input_grads": [a.grad for a in acts], "loss": loss.item()}

    def launch(self, inputs):
        per_rank = [(stage_of(inputs["layers"], r), inputs["x"] if r == 0 else None,
                     inputs["target"] if r == P - 1 else None) for r in range(P)]
        return (M, (MB, D)), per_rank

    def program(self, module):
        step = getattr(module, self.entries[0])

        def run(dist, n_micro, micro_shape, layers, x, target):
            for w1, w2 in layers:  # zeroed gradients, as after optimizer.zero_grad(set_to_none=False)
                w1.grad, w2.grad = torch.zeros_like(w1), torch.zeros_like(w2)
            dx = step(dist, layers, x, target, n_micro, micro_shape)
            return {"grads": [(w1.grad, w2.grad) for w1, w2 in layers],
                    "input_grad": dx.detach() if isinstance(dx, torch.Tensor) else dx}

        return run

    def budgets(self, inputs):
        return {"bubble": Budget("bubble", "(p-1)/(m+p-1) + 0.5 points = 3/11 + 0.005",
                                 float(Fraction(P - 1, M + P - 1) + TOLERANCE), "fraction")}

    # ---- checks

    def check(self, obs: Observation, ref, inputs):
        diagnose = lambda bad: self.diagnose_values(bad, obs, ref, inputs)  # noqa: E731
        grad_pairs, input_pairs = [], []
        for r, res in enumerate(obs.results):
            got = res["grads"] if isinstance(res, dict) else None
            for j in range(PER):
                k = r * PER + j
                pair = got[j] if got is not None and j < len(got) else (None, None)
                for which, g, e in (("w1", pair[0], ref["grads"][k][0]), ("w2", pair[1], ref["grads"][k][1])):
                    grad_pairs.append((f"rank {r}: layers[{j}].{which}.grad (block {k})", g, e, (r, j, which)))
            dx = res.get("input_grad") if isinstance(res, dict) else None
            what = "dL/dx" if r == 0 else f"dL/d(stage {r} input)"
            input_pairs.append((f"rank {r}: the returned input gradient ({what})", dx, ref["input_grads"][r],
                                (r, None, "input")))
        checks = [values_check("stage gradients", grad_pairs, "stage gradients", diagnose),
                  values_check("input gradients", input_pairs, "input gradients", diagnose),
                  self.bubble_check(obs, inputs)]
        checks += self.extra_checks(obs, ref, inputs)
        n_msgs = len(obs.events_of(stream="comm", kind="send"))
        checks.append(Check("no deadlock", True, f"every rank returned; all {n_msgs} sends met their recvs"))
        return checks

    def extra_checks(self, obs, ref, inputs) -> list[Check]:
        return []

    def bubble_check(self, obs: Observation, inputs) -> Check:
        budget = self.budgets(inputs)["bubble"]
        bubble = obs.idle_fraction()
        busy = [obs.busy_ticks(r) for r in range(P)]
        ideal = (M + P - 1) * 3 * F_TICKS
        what = (f"the compute streams sat idle {fmt(bubble, 'fraction')} of the makespan ({fmt(obs.makespan, 'ticks')};"
                f" each rank computed {', '.join(f'{b:,}' for b in busy)} ticks; a perfect {P}-stage pipeline of "
                f"{M} microbatches takes (m+p-1)·3F = {fmt(ideal, 'ticks')})")
        ok = bubble <= budget.value
        message = f"{what}, {'within' if ok else 'over'} the budget {budget.describe()}"
        return Check("bubble", ok, message, measured=round(bubble, 6), budget=budget,
                     diagnosis="" if ok else self.diagnose_bubble(obs))

    # ---- diagnoses

    def diagnose_bubble(self, obs: Observation) -> str:
        sends = [e for e in obs.events_of(0, "comm", "send")]
        if len(sends) < M:
            whole = [e for e in sends if e["nbytes"] >= B * D * 8]
            if len(sends) == 1 and whole:
                return (f"rank 0 sent one activation of {fmt(whole[0]['nbytes'], 'bytes')}: the whole batch as one "
                        f"microbatch, so only one stage works at a time and the bubble is (p-1)/p = 75%. Split the "
                        f"batch into m = {M} microbatches of {MB} rows and send each as soon as it is computed")
            return (f"rank 0 sent {len(sends)} activations, fewer than the m = {M} microbatches: is every "
                    f"microbatch sent separately?")
        ahead = self.forwards_before_first_backward(obs, 0)
        if ahead is not None and ahead <= 1:
            return ("rank 0 ran a backward after its first forward, before the forward of the next microbatch: "
                    "each microbatch goes through the whole pipeline and back before the next one starts, so only "
                    "one stage works at a time. Start microbatch i+1's forward while microbatch i is still in the "
                    "later stages")
        fwd = obs.events_of(0, "compute", "forward")
        first_send = min(e["start"] for e in sends)
        if fwd and first_send >= self.forward_ticks_end(obs, 0):
            return ("rank 0 sent its first activation only after computing every forward: the next stage sat idle "
                    "all that time. Send each microbatch's activation as soon as it is computed")
        busy = [obs.busy_ticks(r) for r in range(P)]
        if len(set(busy)) > 1:
            light = min(range(P), key=lambda r: busy[r])
            hint = (" Did rank 0 skip backpropagating into its input? dL/dx is part of the contract, and computing it "
                    "makes its backward 2F like every other stage's" if light == 0 else "")
            amounts = ", ".join(f"rank {r}: {b:,}" for r, b in enumerate(busy))
            return (f"the ranks computed different amounts: {amounts} ticks; the formula (p-1)/(m+p-1) holds for stages of equal cost, {M}·3F = {M * 3 * F_TICKS:,} "
                    f"ticks each.{hint}")
        idle = [1 - b / obs.makespan for b in busy]
        return ("the ranks idled " + ", ".join(f"rank {r}: {fmt(v, 'fraction')}" for r, v in enumerate(idle))
                + ": look at the schedule chart for where a rank waits on a message it could have had earlier")

    @staticmethod
    def forwards_before_first_backward(obs: Observation, rank: int) -> float | None:
        """How many microbatch forwards (in units of F) a rank computed before its first backward."""
        bwd = obs.events_of(rank, "compute", "backward")
        if not bwd:
            return None
        first = min(e["start"] for e in bwd)
        ticks = sum(e["end"] - e["start"] for e in obs.events_of(rank, "compute", "forward") if e["end"] <= first)
        return ticks / F_TICKS

    @staticmethod
    def forward_ticks_end(obs: Observation, rank: int) -> int:
        """When the rank's compute had done as many forward ticks as all of its microbatches need."""
        total = 0
        for e in obs.events_of(rank, "compute", "forward"):
            total += e["end"] - e["start"]
            if total >= M * F_TICKS:
                return e["end"]
        return obs.makespan

    def diagnose_values(self, bad, obs: Observation, ref, inputs) -> str:
        """Name the likely mistake from the gradients that are off."""
        results = obs.results
        first = bad[0]
        f = ratio(first.got, first.expected) if isinstance(first.got, torch.Tensor) else None
        if f is not None and all(ratio(m.got, m.expected) is not None
                                 and abs(ratio(m.got, m.expected) - f) < 1e-6 for m in bad):
            if abs(f - M) < 1e-6:
                return (f"exactly {M}x the reference, everywhere: the microbatch losses were added, not averaged. "
                        f"The full-batch loss is the mean of the m = {M} microbatch losses: scale each by 1/{M}")
            if abs(f - 1 / M) < 1e-6:
                return f"exactly 1/{M} of the reference: the loss was scaled by 1/m twice?"
            if abs(f - 1 / M ** 2) > 1e-6 and abs(f - round(f)) < 1e-6 and f > 1:
                return f"exactly {f:g}x the reference: a gradient added {f:g} times?"
        if any(m.got is None for m in bad):
            missing = next(m for m in bad if m.got is None)
            if missing.meta == (0, None, "input"):
                return ("rank 0 returned no dL/dx: make each of its microbatches a leaf that requires grad "
                        "(x.chunk(n_micro)[i].detach().requires_grad_()), so that backward computes its gradient, "
                        "and return the microbatches' gradients concatenated")
            return (f"{missing.label} is None: did this rank run backward on every microbatch (and return the "
                    f"input gradients, microbatch i in rows {MB}i to {MB}i+{MB - 1})?")
        ranks = sorted({m.meta[0] for m in bad})
        top = ranks[-1]
        return self.diagnose_rank(top, ranks, results, ref, inputs)

    def diagnose_rank(self, top, ranks, results, ref, inputs) -> str:
        """The highest rank that is wrong: everything downstream of it is right, so its mistake is its own."""
        res = results[top]
        stage_layers = stage_of(inputs["layers"], top)
        a = ref["acts"][top].chunk(M)
        dx = res.get("input_grad") if isinstance(res, dict) else None
        if top == P - 1:
            expected = ref["input_grads"][top].chunk(M)
            if isinstance(dx, torch.Tensor) and dx.shape == ref["input_grads"][top].shape:
                perm = match_chunks(dx.chunk(M), expected)
                if perm is not None:
                    return self.wrong_slot(top, perm)
            return (f"rank {top} (the last stage) is off although it needs nobody's gradient: check its loss, "
                    f"loss_fn(y, target_i) / {M} on microbatch i's rows of the targets")
        g = ref["input_grads"][top + 1].chunk(M)
        if isinstance(dx, torch.Tensor) and dx.shape == ref["input_grads"][top].shape:
            got = dx.chunk(M)
            expected = ref["input_grads"][top].chunk(M)
            perm = match_chunks(got, expected)
            if perm is not None and perm != list(range(M)):
                return self.wrong_slot(top, perm)
            pairing = []
            for i in range(M):
                hit = None
                for j in range(M):
                    if close(stage_vjp(stage_layers, a[i], g[j])[0], got[i]):
                        hit = j
                        break
                pairing.append(hit)
            if all(p is not None for p in pairing) and pairing != list(range(M)):
                wrong = [(i, j) for i, j in enumerate(pairing) if i != j]
                shown = ", ".join(f"microbatch {i}'s activations got microbatch {j}'s gradient" for i, j in wrong[:3])
                more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
                return (f"gradient received for the wrong microbatch: rank {top} backpropagated the gradients that "
                        f"rank {top + 1} sent through the activations of other microbatches ({shown}{more}). "
                        f"{self.pairing_hint()}")
        downstream = "every stage after it is right" if top < P - 1 else ""
        return (f"rank {top} is the last stage that is off ({downstream}): its own forward/backward of some "
                f"microbatch went wrong. Does each gradient it receives go through the graph of the same microbatch, "
                f"and does it accumulate (not overwrite) its gradients over all {M} microbatches?")

    def pairing_hint(self) -> str:
        return ("A rank must run its backwards in the same order as the rank after it sends the gradients (here: "
                "every rank newest first, or every rank oldest first).")

    @staticmethod
    def wrong_slot(rank, perm) -> str:
        i = next(i for i, j in enumerate(perm) if i != j)
        return (f"rank {rank} returned its input gradients in the wrong order: rows {MB * i}-{MB * i + MB - 1} hold "
                f"microbatch {perm[i]}'s gradient, not microbatch {i}'s. Put microbatch i's at rows "
                f"{MB}i to {MB}i+{MB - 1}")


def close(got, expected) -> bool:
    scale = max(1.0, expected.abs().max().item())
    return (got - expected).abs().max().item() <= 1e-8 * scale


def match_chunks(got, expected) -> list[int] | None:
    """For each got chunk, the index of the expected chunk it equals; None if some chunk equals none."""
    perm = []
    for c in got:
        j = next((j for j, e in enumerate(expected) if close(c, e)), None)
        if j is None:
            return None
        perm.append(j)
    return perm


class GPipe(PipelineSpec):
    id, name, title = "p5", "gpipe", "Pipeline parallel (GPipe)"
    entries = ("gpipe_step",)
    hints = ("Scale each microbatch's loss by 1/m: the full-batch loss is their mean.",
             "Every rank must run its backwards in the order the next rank sends the gradients.")


SPEC = GPipe()
