"""p17 zero-bubble pipeline (ZB-H1): puzzle 6's stages and microbatches, the backward split into B (the input
gradient, on the critical path) and W (the weight gradients, deferred into the bubble).

    stage gradients, input gradients   as in p5/p6 (common/pipeline.py)
    stage compute                      at most m·(F + B + W) per stage (the split as autograd runs it), at least
                                       the products of one forward and one backward per microbatch
    bubble                             the last stage's idle time, makespan - its compute (counted up to its work
                                       in the formula, so that filler buys nothing), at most ZB-H1's
                                       (p-1)·max(F, B, F + B - W) + B/2: under a third of 1F1B's (p-1)·(F + BW)
    activation memory                  on every rank, at most 1F1B's rank 0 (p microbatches) and the p inputs it
                                       received
    B before W                         each input gradient leaves before its microbatch's weight gradients are
                                       computed, read off the FLOPs at each send: autograd's backward FLOPs, and
                                       all the compute less the forwards' (a backward written as the learner's own
                                       products runs outside autograd); "not judged" where the forwards run by a
                                       send cannot be told from the weight gradients

The bubble is measured against the answer's own compute because two correct splits cost differently (autograd's
walks the stage twice; Megatron-LM's WeightGradStore does not): against the formula's work alone, a 1F1B order with
the cheaper split would pass. The cap at the formula's work stops filler from an answer that does the formula's
work; an answer with the cheaper split has room under the cap (about a third of its work), and dummy compute placed
exactly in its idle slots would count as work there. No notion of useful work on the clock closes that; the
compute ceiling bounds it in FLOPs, not in copies' ticks.

The costs and the formula live in costs.py.
"""

from __future__ import annotations

from ...core.compare import safe_diagnosis
from ...core.result import Budget, Check, fmt
from ...core.rules import flops
from ...core.spec import Observation
from ..common.pipeline import PipelineSpec
from ..common.pipeline_values import ALLOWANCE, BACKWARD, D, H, M, MB, P, PER
from ..common.pipeline_values import B as BATCH
from ..p6_one_f_one_b.spec import ACT, WORKSPACE
from .costs import (B, B_COST, BW, F, F_COST, LAST_B, LAST_F, LAST_W, ONE_F_ONE_B_IDLE, SLACK, STAGE_WORK, W, W_COST,
                    ZB_IDLE)

WEIGHTS = PER * 2 * D * H * 8  # this stage's weights; their gradients are as many bytes again
RECEIVED = MB * D * 8  # one microbatch's stage input, received into a buffer of its own (ranks 1 to p-1)
MEMORY = P * ACT + P * RECEIVED + WORKSPACE  # 1F1B's rank-0 bound (p6) and the p inputs a later rank received


def static_bytes(rank: int) -> int:
    """Weights, gradients, x (rank 0) or target (the last rank), and the returned dL/d(input)."""
    handed = BATCH * D * 8 if rank in (0, P - 1) else 0
    return 2 * WEIGHTS + handed + BATCH * D * 8


def b_cost(rank: int) -> int:
    """B's FLOPs on `rank` (the last stage's includes the loss's backward)."""
    return LAST_B.flops if rank == P - 1 else B_COST.flops


class ZeroBubble(PipelineSpec):
    id, name, title = "p17", "zero_bubble", "Zero-bubble pipeline (ZB-H1)"
    entries = ("zero_bubble_step",)
    hints = ("B: torch.autograd.grad(y, a, g, retain_graph=True) gives the input gradient alone and keeps the graph "
             "for W; W: y.backward(g, inputs=weights) adds each weight's gradient into w.grad as it is computed.",
             "Rank r runs 1F1B's warm-up and steady state with B for the backward, and defers r W's: it runs the "
             "oldest W once more than r are waiting, and the rest at the end.",
             "torch.profiler.record_function(f'W{i}') around a W draws it as W on the schedule (--schedule): see "
             "the W's fill what was 1F1B's bubble.")

    @staticmethod
    def backward_flops(rank: int) -> int:
        """One microbatch's backward on `rank`, B and W (the value diagnosis tells a scaled loss from a repeat)."""
        return b_cost(rank) + (LAST_W if rank == P - 1 else W_COST).flops

    def budgets(self, inputs):
        last = STAGE_WORK[P - 1]
        return {
            "stage compute": Budget("stage compute", f"m·(F + B + W) + m·(LF + 2·LB) + m·mb·d (every microbatch "
                                    f"forward once, F = {STAGE_WORK[0].flops // M - B_COST.flops - W_COST.flops:,}, "
                                    f"its input gradient once, B = {B_COST.flops:,}, its weight gradients once, "
                                    f"W = {W_COST.flops:,} (autograd walks the stage again for them); on the last "
                                    f"stage the loss, whose backward B and W both run; m·mb·d for bookkeeping)",
                                    last.flops + ALLOWANCE, "count"),
            "bubble": Budget("bubble", f"(p-1)·max(F, B, F + B - W) + B/2 ticks idle (F = {F:,}, B = {B:,}, "
                             f"W = {W:,} ticks)", ZB_IDLE + SLACK, "ticks"),
            "activation memory": Budget(
                "activation memory", f"p·A + p·mb·d·8 + d·h·8 + A/2 bytes (1F1B's p microbatches on rank 0, "
                f"A = {ACT:,} bytes each, and the p stage inputs a later rank receives)", MEMORY, "bytes"),
            "B before W": Budget("B before W", "input gradients sent late (the k-th after more than k B's and "
                                 "k - 1 W's of backward FLOPs, + B/2)", 0, "count"),
        }

    def memory_lines(self, inputs):
        return [static_bytes(r) + MEMORY for r in range(P)]

    def extra_checks(self, obs: Observation, ref, inputs) -> list[Check]:
        budgets = self.budgets(inputs)
        return [self.memory_check(obs, budgets["activation memory"]),
                self.order_check(obs, budgets["B before W"])]

    # ---- the bubble: idle time against the answer's own work, counted up to the formula's

    @staticmethod
    def idle(obs: Observation) -> tuple[int, int, int]:
        """(the last stage's compute, that compute counted up to its work in the formula, the makespan less it)."""
        busy = obs.busy_ticks(P - 1)
        counted = min(busy, STAGE_WORK[P - 1].ticks)
        return busy, counted, obs.makespan - counted

    def bubble_check(self, obs: Observation, budget: Budget, values_right: bool = True) -> Check:
        refused = self.impossible(obs, budget, values_right)  # the schedule read off the messages first
        if refused is not None:
            return refused
        busy, counted, idle = self.idle(obs)
        ok = idle <= budget.value
        capped = (f", counted up to its work in the formula, m·(F + B + W) + m·(LF + 2·LB) = "
                  f"{fmt(counted, 'ticks')}" if counted < busy else "")
        share = idle / obs.makespan if obs.makespan else 0.0
        message = (f"the step took {fmt(obs.makespan, 'ticks')}; the last stage computed {fmt(busy, 'ticks')}"
                   f"{capped} and idled {fmt(idle, 'ticks')} ({fmt(share, 'fraction')} of the step), "
                   f"{'within' if ok else 'over'} the budget {budget.describe()}. 1F1B idles (p-1)·(F + BW) = "
                   f"{ONE_F_ONE_B_IDLE:,} ticks (27.3%), a third of it is {ONE_F_ONE_B_IDLE // 3:,}. Compute per "
                   f"rank: {', '.join(f'{obs.busy_ticks(r):,}' for r in range(P))} ticks")
        return Check("bubble", ok, message, measured=idle, budget=budget,
                     diagnosis="" if ok else safe_diagnosis(self.diagnose_bubble, obs))

    def diagnose_bubble(self, obs: Observation) -> str:
        busy, _, idle = self.idle(obs)
        if busy > STAGE_WORK[P - 1].ticks * 21 // 20:
            return "the last stage computed more than its work (see stage compute), and the step took longer"
        late = self.first_late_send(obs)
        if late is not None:
            return ("the input gradients waited for the weight gradients (see B before W): the whole backward sat on "
                    "the critical path, as in 1F1B")
        fused = (P - 1) * (F + BW)
        split = (P - 1) * (F + B)
        waiting = self.w_waiting(obs)
        if waiting and all(n <= 1 for counts in waiting.values() for n in counts) and abs(idle - split) <= SLACK:
            return (f"the bubble is that of 1F1B with the backward split, (p-1)·(F + B) = {split:,} ticks: each W ran "
                    f"right after its B, so the cool-down's gaps stayed empty. Defer the W's: rank r keeps r of them "
                    f"waiting and runs them when it would otherwise wait, at the end")
        if waiting and all(counts[-1] == M for counts in waiting.values()):
            return (f"every W ran after the last B (ranks {', '.join(map(str, waiting))} still held all {M} W's "
                    f"when they sent their last input gradient): there, after the cool-down, they fill no gap, and "
                    f"the cool-down's gaps, each rank waiting for the next gradient, stayed empty. ZB-H1 runs a "
                    f"deferred W in each gap of the cool-down: rank r keeps only r waiting, runs the oldest once more "
                    f"than r wait, and holding them all holds every microbatch's activations (see activation memory)")
        if abs(idle - fused) <= SLACK:
            return f"the bubble is 1F1B's, (p-1)·(F + BW) = {fused:,} ticks"
        waits = [(r, self.idle_with_w_waiting(obs, r)) for r in range(1, P)]
        r, ticks = max(waits, key=lambda rw: rw[1])
        if ticks > SLACK:
            return (f"rank {r} sat idle {ticks:,} ticks waiting for a message while it held a W it had deferred, "
                    f"ready to run: a W belongs before the receive that blocks (a recv, a wait(), or "
                    f"batch_isend_irecv's handles), where it fills the wait, not after it")
        return ""  # nothing above singles a mistake out: no hint rather than a guess

    def w_waiting(self, obs: Observation) -> dict[int, list[int]]:
        """For ranks 1 to p-1, the W's each held when it sent each input gradient (its B's done less its W's, read
        off the backward FLOPs as the B before W check reads them); {} where they cannot be read apart."""
        out = {}
        for r in range(1, P):
            b, w, done = self.backward_done(obs, r, autograd=True)
            if w < b // 2:  # the W's (or all the backward) are the learner's own products
                b, w, done = self.backward_done(obs, r, autograd=False)
            if w < b // 2 or len(done) != M:
                return {}
            out[r] = [k - round((d - k * b) / w) for k, (_, d) in enumerate(done, start=1)]
        return out

    @staticmethod
    def idle_with_w_waiting(obs: Observation, rank: int) -> int:
        """The ticks `rank` sat idle while it had run more B's than W's: B's counted by the input gradients it had
        sent, W's by the backward FLOPs beyond those B's (its own W's size, read off its total)."""
        b = b_cost(rank)
        w = (flops(obs, rank, "backward") - M * b) // M
        if w <= 0:
            return 0
        compute = sorted(obs.events_of(rank, "compute"), key=lambda e: e["start"])
        sends = [e.get("issued") or e["start"] for e in obs.events_of(rank, "comm", "send")
                 if e["peers"][-1] == rank - 1]
        total = 0
        for before, after in zip(compute, compute[1:]):
            if after["start"] <= before["end"]:
                continue
            t = before["end"]
            bs = sum(1 for s in sends if s <= t)
            done = sum(e["flops"] for e in compute if e["kind"] == "backward" and e["end"] <= t)
            if bs - round((done - bs * b) / w) >= 1:
                total += after["start"] - t
        return total

    # ---- activation memory

    def memory_check(self, obs: Observation, budget: Budget) -> Check:
        held = [obs.peak_bytes[r] - static_bytes(r) for r in range(P)]
        over = [r for r in range(P) if held[r] > budget.value]
        r = over[0] if over else max(range(P), key=held.__getitem__)
        ok = not over
        units = max(0.0, (held[r] - D * H * 8) / (ACT + RECEIVED))
        message = (f"rank {r} peaked at {fmt(obs.peak_bytes[r], 'bytes')}, {fmt(held[r], 'bytes')} above its weights, "
                   f"gradients, inputs and returned dL/d(input) ({static_bytes(r):,} bytes): about {units:.1f} "
                   f"microbatches' activations and a weight gradient's workspace, {'within' if ok else 'over'} the "
                   f"budget {budget.describe()}. Per rank: {', '.join(f'{h:,}' for h in held)} bytes")
        return Check("activation memory", ok, message, measured=held[r], budget=budget,
                     diagnosis="" if ok else safe_diagnosis(self.diagnose_memory, obs, r, held[r]))

    def diagnose_memory(self, obs: Observation, rank: int, held: int) -> str:
        """From what was alive at the peak, by the line that allocated it: the activations the model's forward
        made (microbatches held), and what autograd's backward allocated (fresh weight gradients)."""
        top = obs.ledgers[rank].get("peak_by_line", [])
        backward = sum(s["bytes"] for s in top if "[backward" in s["site"])
        activations = sum(s["bytes"] for s in top if not s["site"].startswith(("[harness]", "input placed"))
                          and "[backward" not in s["site"])  # the forwards' activations, and inputs received
        if backward >= (2 * PER - 1) * D * H * 8:
            return (f"at rank {rank}'s peak, autograd's backward had allocated {backward:,} bytes, all "
                    f"{2 * PER} of the stage's fresh weight gradients at once (torch.autograd.grad hands back every "
                    f"gradient it computes before you add them into w.grad; 1F1B holds one at a time). W by "
                    f"y.backward(g, inputs=weights) adds each into w.grad as soon as it is computed")
        if activations > (P + 0.5) * (ACT + RECEIVED):
            return (f"rank {rank} held about {activations / (ACT + RECEIVED):.1f} microbatches' activations: a "
                    f"microbatch's are freed by its W, not its B, so every W deferred keeps one more. ZB-H1 defers r "
                    f"W's on rank r and runs p - 1 - r warm-up forwards: p microbatches held on every rank, as 1F1B's "
                    f"rank 0 does")
        sites = "; ".join(f"{s['site']}: {s['bytes']:,} bytes" for s in top[:3])
        return f"what was alive at rank {rank}'s peak: {sites}"

    # ---- B before W

    @staticmethod
    def backward_done(obs: Observation, rank: int, autograd: bool, fewest: bool = False):
        """(B, the rank's own W, [(when it sent its k-th input gradient, the backward FLOPs done by then)]).

        autograd: the FLOPs autograd's backward ran. Otherwise every FLOP less the forwards run by then: a backward
        written as the learner's own products (WeightGradStore style) runs outside autograd. Forwards are counted by
        the inputs that had arrived (a forward needs its input: the most it can have run), or with `fewest` by the
        fewest it can have run (the activations sent on, at least k for k input gradients)."""
        b = b_cost(rank)
        f = (LAST_F if rank == P - 1 else F_COST).flops
        compute = sorted(obs.events_of(rank, "compute", "backward" if autograd else None), key=lambda e: e["end"])
        # when the rank issued each send, on its compute stream (real processes record it as the event's start)
        sends = sorted(e.get("issued") or e["start"] for e in obs.events_of(rank, "comm", "send")
                       if e["peers"][-1] == rank - 1)
        arrived = sorted(e["end"] for e in obs.events_of(rank, "comm", "recv") if tuple(e["peers"]) == (rank - 1, rank))
        passed_on = sorted(e.get("issued") or e["start"] for e in obs.events_of(rank, "comm", "send")
                           if tuple(e["peers"]) == (rank, rank + 1))

        def forwards(k: int, t: int) -> int:
            if autograd:
                return 0
            if fewest:
                return min(M, max(k, sum(1 for s in passed_on if s <= t)))
            return min(M, sum(1 for a in arrived if a < t))  # a forward takes ticks after its input arrives

        total = sum(e["flops"] for e in compute) - (0 if autograd else M * f)
        w = max(0, (total - M * b) // M)
        done = [(t, sum(e["flops"] for e in compute if e["end"] <= t) - forwards(k, t) * f)
                for k, t in enumerate(sends, start=1)]
        return b, w, done

    def order_violations(self, obs: Observation, fewest: bool = False) -> list[tuple[int, int, int, int, bool]]:
        """(rank, k, backward FLOPs done when it sent its k-th input gradient, the most the rule allows, whether
        autograd ran them) where a rank had computed more than k B's and k - 1 W's (its own W, read off its total:
        (backward - m·B)/m), read off autograd's backward FLOPs and off all its FLOPs less its forwards'. `fewest`:
        off all its FLOPs less the fewest forwards it can have run, on the ranks whose W's autograd did not run."""
        out = []
        for r in range(1, P):
            for autograd in (True, False):
                if fewest and (autograd or self.backward_done(obs, r, True)[1] >= b_cost(r) // 2):
                    continue
                b, w, done = self.backward_done(obs, r, autograd, fewest)
                late = [(r, k, d, k * b + (k - 1) * w + b // 2, autograd) for k, (_, d) in enumerate(done, start=1)
                        if d > k * b + (k - 1) * w + b // 2]
                if late:
                    out += late
                    break
        return out

    def first_late_send(self, obs: Observation):
        violations = self.order_violations(obs)
        return violations[0] if violations else None

    def order_check(self, obs: Observation, budget: Budget) -> Check:
        violations = self.order_violations(obs)
        if not violations:
            unsure = self.order_violations(obs, fewest=True)
            if unsure:
                r, k, done, allowed, _ = unsure[0]
                return Check("B before W", True, f"not judged: rank {r} computed its W's outside autograd "
                             f"and received activations before it ran their forwards, so what it ran before its input "
                             f"gradient number {k} left cannot be told apart, forwards or weight gradients: counting "
                             f"only the forwards it must have run, {done - allowed:,} FLOPs more backward than {k} "
                             f"B's and {k - 1} W's allow; counting every activation that had arrived as run, within. "
                             f"Could not tell whether the input gradients waited for weight gradients",
                             measured=0, budget=budget)
            return Check("B before W", True, "every input gradient ranks 1 to p-1 sent left before its microbatch's "
                         "weight gradients were computed (read off the FLOPs at each send: autograd's backward, and "
                         "all of them less the forwards'; rank 0 sends none)", measured=0, budget=budget)
        r, k, done, allowed, autograd = violations[0]
        what = "of backward" if autograd else "beyond its forwards (its own products, outside autograd's backward)"
        message = (f"rank {r} sent its input gradient number {k} to rank {r - 1} after {done:,} FLOPs {what}, "
                   f"more than {k} B's and {k - 1} W's allow ({allowed:,}, B = {b_cost(r):,}): a weight gradient ran "
                   f"before the input gradient it could have waited behind. {len(violations)} sends were late")
        return Check("B before W", False, message, measured=len(violations), budget=budget,
                     diagnosis=safe_diagnosis(self.diagnose_order, obs, r, k, done, autograd))

    @staticmethod
    def diagnose_order(obs: Observation, rank: int, k: int, done: int, autograd: bool = True) -> str:
        b = b_cost(rank)
        whole = BACKWARD.flops + (LAST_B.flops - B_COST.flops if rank == P - 1 else 0)
        if autograd and k == 1 and abs(done - whole) <= b // 10:
            return (f"rank {rank}'s first input gradient left after {done:,} FLOPs of backward, a whole backward's "
                    f"(BW = {whole:,}): the backward was not split (y.backward(g) computes the input and the weight "
                    f"gradients together). B is torch.autograd.grad(y, a, g, retain_graph=True); W, later, "
                    f"y.backward(g, inputs=weights)")
        return (f"rank {rank} computed weight gradients before sending input gradient number {k} (it had done "
                f"{done / b:.2f} B's worth of backward): when a microbatch's gradient arrives, run its B and send "
                f"the input gradient on at once; its W can wait")


SPEC = ZeroBubble()
