"""What p5 (GPipe), p6 (1F1B) and p17 (ZB-H1) share: the model cut into p stages, the inputs, the serial reference cut at the
stage boundaries, and the checks of both puzzles' rules.

    stage gradients, input gradients   every w.grad and the returned dL/d(stage input) against the serial step
    stage compute                      each rank computes its own blocks only, each microbatch forward once (F)
                                       and backward once (BW), the last stage its loss too (LF, LB): at most
                                       m·(F + BW + LF + LB) FLOPs and a little bookkeeping, so no recomputation
                                       and no other stage's blocks
    bubble                             1 - W/makespan, W = m·(F + BW + LF + LB) the last (busiest) stage's own
                                       work on the clock (its own compute where that is less, so never below
                                       zero): at most (p-1)/(m+p-1) + 0.5 points; read only once the clock holds
                                       each stage's work between the messages that need it, and a makespan at
                                       least the critical path's products at the peak rate
                                       (pipeline_schedule.py); else the check fails as impossible

The model cut into stages, and the diagnosis of wrong values, live in pipeline_values.py; the schedule read
off the messages, in pipeline_schedule.py.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from puzzles.model import forward, init_layers, loss_fn, make_batch

from ...core.compare import safe_diagnosis, values_check
from ...core.result import Budget, Check, fmt
from ...core.rules import compute_check, flops, work_sequence
from ...core.schedule import peak_ticks
from ...core.spec import Observation, PuzzleSpec
from .pipeline_schedule import impossible, stage_relays
from .pipeline_values import (ALLOWANCE, B, BACKWARD, COST, D, FORWARD, H, L, LOSS_BACKWARD, LOSS_FORWARD, M, MB, P,
                              PRODUCTS, STAGE_WORK, TOLERANCE, WORK_SLACK, backward_cost, diagnose_values, forward_cost, stage_of,
                              value_pairs)


class PipelineSpec(PuzzleSpec):
    """What p5 and p6 share. Subclasses set id, name, title, entries and hints, and may add checks
    (extra_checks) and refine the bubble's diagnosis."""

    world_size = P
    cost = COST
    simulator_only = ("bubble",)  # read off the simulated clock's makespan

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
        last = STAGE_WORK[P - 1]
        return {
            "stage compute": Budget("stage compute", f"m·(F + BW + LF + LB) + m·mb·d (every microbatch forward once "
                                    f"through the stage's blocks, F = {FORWARD.flops:,}, and backward once, "
                                    f"BW = {BACKWARD.flops:,}; the last stage's loss, LF + LB = "
                                    f"{(LOSS_FORWARD + LOSS_BACKWARD).flops:,}; m·mb·d for bookkeeping)",
                                    last.flops + ALLOWANCE, "count"),
            "bubble": Budget("bubble", "(p-1)/(m+p-1) + 0.5 points = 3/11 + 0.005",
                             float(Fraction(P - 1, M + P - 1) + TOLERANCE), "fraction"),
        }

    # ---- checks

    def check(self, obs: Observation, ref, inputs):
        grad_pairs, input_pairs = value_pairs(obs, ref)
        cause = {}

        def diagnose(_bad):  # one diagnosis for both value checks, from the whole picture, made once
            if "text" not in cause:
                cause["text"] = diagnose_values(self, obs, ref, inputs, grad_pairs, input_pairs)
            return cause["text"]

        budgets = self.budgets(inputs)
        values = [values_check("stage gradients", grad_pairs, "stage gradients", diagnose),
                  values_check("input gradients", input_pairs, "input gradients", diagnose)]
        checks = values + [compute_check(obs, budgets["stage compute"], self.diagnose_compute, name="stage compute",
                                         least=M * PRODUCTS),
                           self.bubble_check(obs, budgets["bubble"], all(c.passed for c in values))]
        return checks + self.extra_checks(obs, ref, inputs)

    def extra_checks(self, obs, ref, inputs) -> list[Check]:
        return []

    # ---- the schedule the bubble is read off

    def relays(self, obs: Observation, rank: int):
        """The stage's work between its messages (common/pipeline_schedule.py): F, B and W products per
        microbatch are each a third of the stage's PRODUCTS."""
        return stage_relays(obs, rank, rank - 1 if rank else None, rank + 1 if rank < P - 1 else None, M, MB * D * 8,
                            PRODUCTS // 3, PRODUCTS // 3, PRODUCTS // 3)

    def impossible(self, obs: Observation, budget: Budget, values_right: bool) -> Check | None:
        """A schedule the clock could not have run: a stage's work missing between its messages, or a makespan
        below the critical path's work, (p-1) forwards to reach the last stage and its m forwards and backwards."""
        floor = peak_ticks((P - 1) * (PRODUCTS // 3) + M * PRODUCTS, self.cost.device)
        return impossible(obs, lambda r: self.relays(obs, r), floor,
                          "the products of (p-1) stage forwards and the last stage's m forwards and backwards",
                          budget, values_right)

    def bubble_check(self, obs: Observation, budget: Budget, values_right: bool = True) -> Check:
        refused = self.impossible(obs, budget, values_right)
        if refused is not None:
            return refused
        busy = obs.busy_ticks(P - 1)
        work = min(STAGE_WORK[P - 1].ticks, busy)  # the last stage's own work: m forwards and backwards, with the loss
        ideal = (M + P - 1) * (FORWARD + BACKWARD).ticks + M * (LOSS_FORWARD + LOSS_BACKWARD).ticks
        bubble = 1 - work / obs.makespan if obs.makespan else 0.0
        ok = bubble <= budget.value
        own = (f" (counted as its own compute, {fmt(busy, 'ticks')}, where that is less: a bubble is never below zero)"
               if busy < STAGE_WORK[P - 1].ticks else "")
        message = (f"the step took {fmt(obs.makespan, 'ticks')}, against the last stage's own work of "
                   f"W = m·(F + BW + LF + LB) = {fmt(STAGE_WORK[P - 1].ticks, 'ticks')}{own}: a bubble of "
                   f"1 - W/makespan = "
                   f"{fmt(bubble, 'fraction')}, {'within' if ok else 'over'} the budget {budget.describe()} (a "
                   f"perfect {P}-stage pipeline of {M} microbatches takes about (m+p-1)·(F + BW) + m·(LF + LB) = "
                   f"{fmt(ideal, 'ticks')}). Compute per rank: "
                   f"{', '.join(f'{obs.busy_ticks(r):,}' for r in range(P))} ticks")
        return Check("bubble", ok, message, measured=round(bubble, 6), budget=budget,
                     diagnosis="" if ok else safe_diagnosis(self.diagnose_bubble, obs))

    # ---- what a rank ran, microbatch by microbatch

    @staticmethod
    def sequence(obs: Observation, rank: int) -> str:
        """'FFFFBFBF...': the rank's whole microbatch forwards (F) and backwards (BW), in order. A rank whose
        backwards are lighter (rank 0 skipping dL/dx, a wrong answer of its own) has its backwards counted as the
        m equal parts of what it ran, so that the schedule still reads right."""
        backward = flops(obs, rank, "backward")
        full = backward_cost(rank).flops
        unit = min(full, backward // M) if backward else full
        return work_sequence(obs, rank, forward_cost(rank).flops, max(unit, 1))

    @classmethod
    def forwards_before_first_backward(cls, obs: Observation, rank: int) -> int | None:
        seq = cls.sequence(obs, rank)
        return seq.index("B") if "B" in seq else None

    # ---- diagnoses

    @staticmethod
    def diagnose_compute(rank, fwd, bwd) -> str:
        f, b = forward_cost(rank).flops, backward_cost(rank).flops
        if abs((fwd + bwd) - sum(w.flops for w in STAGE_WORK)) < f:
            return (f"rank {rank} computed the work of all {P} stages: every stage's blocks ran on one rank. Each "
                    f"rank runs only its own blocks, `layers`, and passes the activations on")
        if abs(fwd - 2 * M * f) < f and abs(bwd - M * b) < f:
            return (f"rank {rank} ran every microbatch's forward twice (2·m·F outside backward, m·BW inside): "
                    f"recomputation. This puzzle keeps each microbatch's activations from its forward to its "
                    f"backward and computes each forward once")
        return (f"rank {rank} computed {fwd / f:.1f} microbatch forwards' worth outside backward and "
                f"{bwd / b:.1f} backwards' worth inside it; a stage runs m = {M} of each")

    def diagnose_bubble(self, obs: Observation) -> str:
        busy = [obs.busy_ticks(r) for r in range(P)]
        if any(b > w.ticks * (1 + WORK_SLACK) for b, w in zip(busy, STAGE_WORK)):
            return "the ranks computed more than their stage's work (see stage compute), and the step took longer"
        sends = obs.events_of(0, "comm", "send")
        if len(sends) < M:
            whole = [e for e in sends if e["nbytes"] >= B * D * 8]
            if len(sends) == 1 and whole:
                return (f"rank 0 sent one activation of {fmt(whole[0]['nbytes'], 'bytes')}: the whole batch as one "
                        f"microbatch, so only one stage works at a time and the bubble is (p-1)/p = 75%. Split the "
                        f"batch into m = {M} microbatches of {MB} rows and send each as soon as it is computed")
            return (f"rank 0 sent {len(sends)} activations; a pipeline of m = {M} microbatches sends {M}, one as soon "
                    f"as each is computed")
        ahead = self.forwards_before_first_backward(obs, 0)
        if ahead is not None and ahead <= 1:
            return ("rank 0 ran a backward after its first forward, before the forward of the next microbatch: "
                    "each microbatch goes through the whole pipeline and back before the next one starts, so only "
                    "one stage works at a time. Start microbatch i+1's forward while microbatch i is still in the "
                    "later stages")
        if obs.events_of(0, "compute", "forward") and min(e["start"] for e in sends) >= self.forwards_end(obs, 0):
            return ("rank 0 sent its first activation only after computing every forward: the next stage sat idle "
                    "all that time. Send each microbatch's activation as soon as it is computed")
        short = [r for r, (b, w) in enumerate(zip(busy, STAGE_WORK)) if b < w.ticks * (1 - WORK_SLACK)]
        if short:
            amounts = ", ".join(f"rank {r}: {busy[r]:,} of {STAGE_WORK[r].ticks:,}" for r in short)
            return (f"some ranks computed less than their stage's work ({amounts} ticks), so the stages were "
                    f"unequal; the formula (p-1)/(m+p-1) holds for stages of equal cost")
        idle = [1 - b / obs.makespan for b in busy]
        return ("the ranks idled " + ", ".join(f"rank {r}: {fmt(v, 'fraction')}" for r, v in enumerate(idle))
                + ": look at the schedule chart for where a rank waits on a message it could have had earlier")

    @staticmethod
    def forwards_end(obs: Observation, rank: int) -> int:
        """When the rank's compute had done as many forward FLOPs as all of its microbatches need."""
        total = 0
        for e in obs.events_of(rank, "compute", "forward"):
            total += e["flops"]
            if total >= M * forward_cost(rank).flops:
                return e["end"]
        return obs.makespan

    def pairing_hint(self) -> str:
        return ("A rank must run its backwards in the same order as the rank after it sends the gradients (here: "
                "every rank newest first, or every rank oldest first).")
