"""p6 pipeline parallel, 1F1B: p5's checks, the 1F1B schedule itself (no rank holds more than p - rank
microbatches at once), and rank 0's activation memory (at most p microbatches; GPipe holds m)."""

from __future__ import annotations

from ...core.compare import safe_diagnosis
from ...core.result import Budget, Check, fmt
from ...core.rules import most_held
from ...core.spec import Observation
from ..common.pipeline import PipelineSpec
from ..common.pipeline_values import MB, PER, STAGE_WORK, WORK_SLACK, B, D, H, M, P

WEIGHTS = PER * 2 * D * H * 8  # this stage's weights; their gradients are as many bytes again
STATIC = 2 * WEIGHTS + 2 * B * D * 8  # weights, gradients, x and the returned dL/dx on rank 0
ACT = PER * (2 * MB * H + MB * D) * 8  # one microbatch's activations on one stage
WORKSPACE = D * H * 8 + ACT // 2  # a weight's fresh gradient before it is added into w.grad, plus slack


def one_f_one_b(rank: int) -> str:
    """The 1F1B order of `rank`: p-1-rank warm-up forwards, then forward/backward pairs, then the cool-down."""
    warmup = min(P - 1 - rank, M)
    return "F" * warmup + "FB" * (M - warmup) + "B" * warmup


class OneFOneB(PipelineSpec):
    id, name, title = "p6", "one_f_one_b", "Pipeline parallel (1F1B)"
    entries = ("one_f_one_b_step",)
    hints = ("Rank r runs p-1-r warm-up forwards, then one forward and one backward at a time, then the "
             "backwards left over.",
             "Backward the oldest microbatch held (a queue, not a stack).",
             "Post each send together with the receive that goes with it (batch_isend_irecv).")

    def budgets(self, inputs):
        budgets = super().budgets(inputs)
        budgets["1F1B schedule"] = Budget("1F1B schedule", "p - rank microbatches held at once on each rank "
                                          "(forwards begun minus backwards done; p on rank 0)", P, "count")
        budgets["stage-0 activation memory"] = Budget(
            "stage-0 activation memory", "p·A + d·h·8 + A/2 bytes (A = one microbatch's stage activations, "
            f"{ACT:,} bytes)", P * ACT + WORKSPACE, "bytes")
        return budgets

    def memory_lines(self, inputs):
        """Rank 0's budget as a total, for its memory plot: the static bytes plus the activation budget."""
        return [STATIC + self.budgets(inputs)["stage-0 activation memory"].value] + [None] * (self.world_size - 1)

    def extra_checks(self, obs: Observation, ref, inputs) -> list[Check]:
        budgets = self.budgets(inputs)
        return [self.schedule_check(obs, budgets["1F1B schedule"]),
                self.memory_check(obs, budgets["stage-0 activation memory"])]

    def schedule_check(self, obs: Observation, budget: Budget) -> Check:
        sequences = [self.sequence(obs, r) for r in range(P)]
        held = [most_held(s)[0] for s in sequences]
        limits = [min(P - r, M) for r in range(P)]
        over = [r for r in range(P) if held[r] > limits[r]]
        shown = ", ".join(f"rank {r}: {h}" for r, h in enumerate(held))
        if not over:
            return Check("1F1B schedule", True, f"the most microbatches each rank held at once (forwards begun minus "
                         f"backwards done): {shown}; 1F1B allows p - rank: {', '.join(map(str, limits))}",
                         measured=held[0], budget=budget)
        r = over[0]
        n, at = most_held(sequences[r])
        message = (f"rank {r} held {n} microbatches at once (after {at + 1} units of work), more than "
                   f"p - rank = {limits[r]}. Rank {r} ran {sequences[r] or '(nothing)'}; 1F1B runs "
                   f"{one_f_one_b(r)} (F: one microbatch's forward through the stage, B: its backward, read off the "
                   f"FLOPs). Held at once, per rank: {shown}")
        return Check("1F1B schedule", False, message, measured=held[r], budget=budget,
                     diagnosis=safe_diagnosis(self.diagnose_schedule, r, sequences[r], n))

    @staticmethod
    def diagnose_schedule(rank: int, sequence: str, n: int) -> str:
        ahead = sequence.index("B") if "B" in sequence else len(sequence)
        forwards = sequence.count("F")
        if ahead >= M and forwards == M:
            return (f"still all forwards before all backwards: rank {rank} ran all {M} forwards before its first "
                    f"backward, GPipe's order. Rank r runs p-1-r warm-up forwards, then alternates one forward and "
                    f"one backward")
        if forwards > M:
            return (f"rank {rank} began {forwards} microbatch forwards for m = {M} microbatches: forwards ran again "
                    f"(recomputation?), so its count of what it holds never comes down. 1F1B keeps each "
                    f"microbatch's activations until its backward and runs each forward once")
        if ahead > P - rank and "FF" in sequence[ahead:]:
            return (f"rank {rank} ran {ahead} forwards before its first backward, and later two forwards in a row "
                    f"again: after the p-1-rank warm-up forwards, 1F1B alternates one forward and one backward")
        if ahead > P - rank:
            return (f"rank {rank} ran {ahead} forwards before its first backward; 1F1B runs p - rank = {P - rank}: "
                    f"{P - 1 - rank} warm-up forwards (p-1-rank), then the steady state's first forward, then a "
                    f"backward. Is the warm-up count off by one?")
        return (f"rank {rank} started with {ahead} forwards, as 1F1B does, but later ran two forwards in a row "
                f"without a backward between, and held {n}: after the warm-up, alternate one forward and one "
                f"backward")

    def memory_check(self, obs: Observation, budget: Budget) -> Check:
        held = obs.peak_bytes[0] - STATIC
        ok = held <= budget.value
        microbatches = max(0.0, (held - D * H * 8) / ACT)
        ahead = self.forwards_before_first_backward(obs, 0)
        schedule = (f"; rank 0 ran {ahead} forwards before its first backward (1F1B: p = {P}, GPipe: m = {M})"
                    if ahead is not None else "")
        message = (f"rank 0 peaked at {fmt(obs.peak_bytes[0], 'bytes')}, {fmt(held, 'bytes')} above its weights, "
                   f"gradients, x and dL/dx ({STATIC:,} bytes): about {microbatches:.1f} microbatches' activations "
                   f"(A = {ACT:,} bytes each) plus a weight gradient's workspace, {'within' if ok else 'over'} the "
                   f"budget {budget.describe()}{schedule}")
        return Check("stage-0 activation memory", ok, message, measured=held, budget=budget,
                     diagnosis="" if ok else safe_diagnosis(self.diagnose_memory, obs))

    def diagnose_memory(self, obs: Observation) -> str:
        sequence = self.sequence(obs, 0)
        if most_held(sequence)[0] > P:
            return "the peak follows from the microbatches rank 0 held at once (see 1F1B schedule)"
        top = obs.ledgers[0].get("peak_by_line", [])[:3]
        sites = "; ".join(f"{s['site']}: {s['bytes']:,} bytes" for s in top)
        return (f"rank 0 never held more than p = {P} microbatches, as 1F1B should, but kept more alive than their "
                f"activations: what was alive at the peak: {sites}. Drop each microbatch's tensors once its "
                f"backward is done")

    def diagnose_bubble(self, obs: Observation) -> str:
        if any(most_held(self.sequence(obs, r))[0] > min(P - r, M) for r in range(P)):
            return ("a rank held more microbatches than 1F1B does (see 1F1B schedule), and the ranks before it "
                    "waited for their gradients")
        ahead = [self.forwards_before_first_backward(obs, r) for r in range(P)]
        want = [min(P - r, M) for r in range(P)]
        if None not in ahead and ahead != want and all(obs.busy_ticks(r) <= STAGE_WORK[r].ticks * (1 + WORK_SLACK)
                                                       for r in range(P)):
            got = ", ".join(f"rank {r}: {a}" for r, a in enumerate(ahead))
            short = [r for r in range(P) if ahead[r] < want[r]]
            why = ("Too few in flight: a rank asks for a gradient that the ranks after it cannot have computed "
                   "yet, and waits" if short else
                   "Too many in flight: a rank that runs extra forwards first keeps the ranks before it waiting for "
                   "their gradients")
            return (f"forwards before the first backward: {got}; 1F1B runs p-rank of them (p-1-rank warm-up "
                    f"forwards, then the steady state's first forward): {', '.join(map(str, want))}. {why}. "
                    f"Is the warm-up count p-1-rank?")
        return super().diagnose_bubble(obs)

    def pairing_hint(self) -> str:
        return ("Backward the oldest microbatch a rank holds, first in first out (a queue, not a stack): the "
                "gradients come back in the order the activations went out.")


SPEC = OneFOneB()
