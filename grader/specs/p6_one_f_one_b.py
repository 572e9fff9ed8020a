"""p6 pipeline parallel, 1F1B: p5's checks, and rank 0 holds at most p microbatches' activations (GPipe holds m)."""

from __future__ import annotations

from ..core.result import Budget, Check, fmt
from ..core.spec import Observation
from .p5_gpipe import B, D, H, MB, M, P, PER, PipelineSpec

WEIGHTS = PER * 2 * D * H * 8  # this stage's weights; their gradients are as many bytes again
STATIC = 2 * WEIGHTS + 2 * B * D * 8  # weights, gradients, x and the returned dL/dx on rank 0
ACT = PER * (2 * MB * H + MB * D) * 8  # one microbatch's activations on one stage
WORKSPACE = D * H * 8 + ACT // 2  # a weight's fresh gradient before it is added into w.grad, plus slack


class OneFOneB(PipelineSpec):
    id, name, title = "p6", "one_f_one_b", "Pipeline parallel (1F1B)"
    entries = ("one_f_one_b_step",)
    schedule = "1F1B"
    hints = ("Rank r runs p-1-r warm-up forwards, then one forward and one backward at a time, then the "
             "backwards left over.",
             "Backward the oldest microbatch held (a queue, not a stack).",
             "Post each send together with the receive that goes with it (batch_isend_irecv).")

    def budgets(self, inputs):
        budgets = super().budgets(inputs)
        budgets["stage-0 activation memory"] = Budget(
            "stage-0 activation memory", "p·A + d·h·8 + A/2 bytes (A = one microbatch's stage activations, "
            f"{ACT:,} bytes)", P * ACT + WORKSPACE, "bytes")
        return budgets

    def memory_lines(self, inputs):
        """Rank 0's budget as a total, for its memory plot: the static bytes plus the activation budget."""
        return [STATIC + self.budgets(inputs)["stage-0 activation memory"].value] + [None] * (self.world_size - 1)

    def extra_checks(self, obs: Observation, ref, inputs) -> list[Check]:
        budget = self.budgets(inputs)["stage-0 activation memory"]
        held = obs.peak_bytes[0] - STATIC
        ok = held <= budget.value
        microbatches = max(0.0, (held - D * H * 8) / ACT)
        ahead = self.forwards_before_first_backward(obs, 0)
        schedule = (f"; rank 0 ran {ahead:.0f} forwards before its first backward (1F1B: p = {P}, GPipe: m = {M})"
                    if ahead is not None else "")
        message = (f"rank 0 peaked at {fmt(obs.peak_bytes[0], 'bytes')}, {fmt(held, 'bytes')} above its weights, "
                   f"gradients, x and dL/dx ({STATIC:,} bytes): about {microbatches:.1f} microbatches' activations "
                   f"(A = {ACT:,} bytes each) plus a weight gradient's workspace, {'within' if ok else 'over'} the "
                   f"budget {budget.describe()}{schedule}")
        diagnosis = "" if ok else self.diagnose_memory(obs)
        return [Check("stage-0 activation memory", ok, message, measured=held, budget=budget, diagnosis=diagnosis)]

    def diagnose_memory(self, obs: Observation) -> str:
        ahead = self.forwards_before_first_backward(obs, 0)
        top = obs.ledgers[0].get("peak_by_line", [])[:3]
        sites = "; ".join(f"{s['site']}: {s['bytes']:,} bytes" for s in top)
        if ahead is not None and round(ahead) >= M:
            return (f"still all forwards before all backwards: your schedule holds {M} microbatches on stage 0 "
                    f"(it ran all {M} forwards before its first backward, GPipe's order); 1F1B holds at most "
                    f"p = {P}. Rank r runs p-1-r warm-up forwards, then alternates one forward and one backward")
        if ahead is not None and round(ahead) > P:
            n = round(ahead)
            return (f"your schedule holds {n} microbatches on stage 0 (it ran {n} forwards before its first "
                    f"backward); 1F1B holds at most p = {P}: {P - 1} warm-up forwards on rank 0 (p-1-rank), then the "
                    f"steady state's first forward, then a backward. Is the warm-up count off by one?")
        return (f"stage 0 ran {round(ahead) if ahead is not None else '?'} forwards before its first backward, as 1F1B "
                f"should, but keeps more alive than its microbatches need: what was alive at the peak: {sites}. "
                f"Drop each microbatch's tensors once its backward is done")

    def diagnose_bubble(self, obs: Observation) -> str:
        ahead = [self.forwards_before_first_backward(obs, r) for r in range(P)]
        want = [min(P - r, M) for r in range(P)]
        if None not in ahead and [round(a) for a in ahead] != want:
            got = ", ".join(f"rank {r}: {a:.0f}" for r, a in enumerate(ahead))
            short = [r for r in range(P) if round(ahead[r]) < want[r]]
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
