"""p11 3-D parallelism: 2 data-parallel replicas × 2 pipeline stages × 2 tensor-parallel ranks on 8 ranks, with the
process groups built by the learner.

The rules, each measured as such: every rank's stage gradients and returned input gradients against the serial
model; the groups build_3d_groups returned and the group every collective ran on, the peer of every send
(groups.py); the bytes each rank sent on its tensor-parallel and its data-parallel group; the peak memory
(weights 1/(p·t)); each rank's compute (exactly its 1/8 of the serial step); and the pipeline's bubble, read off
the simulated clock up to the last backward, once the schedule read off the pipeline's messages is one the clock
could have run (common/pipeline_schedule.py). The layout and the sizes are in layout.py."""

from __future__ import annotations

from fractions import Fraction

import torch

from puzzles.model import init_layers, make_batch

from ...core.compare import ratio, safe_diagnosis, tensor_mismatch, values_check
from ...core.result import Budget, Check, fmt
from ...core.rules import (BOOKKEEPING_BYTES, compute_check, flops, group_communication_check, sent_on_group,
                           sized_like, work_sequence)
from ...core.schedule import peak_ticks
from ...core.spec import Observation, PuzzleSpec, pair_at
from ..common.pipeline_schedule import impossible, stage_relays
from .groups import diagnose_dp_bytes, diagnose_tp_bytes, groups_check
from .layout import (ACT, BACKWARD, BR, COST, D, DIM, DP_BYTES, FORWARD, HS, LOSS_BACKWARD, LOSS_FORWARD, M, MB, PER,
                     PRODUCTS, SHARE_FLOPS, STAGE_WORK, TP_BYTES, W_RANK, WORLD, B, H, L, P, T, coords, detached,
                     ACTIVATION, dp_ranks, groups_of, rank_of, rows, serial, shard, sliced, tp_ranks)

TOLERANCE = Fraction(1, 100)  # a point above (p-1)/(m+p-1): the 1-tick all-reduces and sends, f's and g's copies
WORK_SLACK = Fraction(1, 20)  # a rank's compute within 5% of its stage's work is that work (clones, a cat)
# weights, their gradients, x (or target) and dx; then the larger of what GPipe holds (m microbatches' activations
# and a weight's fresh gradient) and a flat copy of the gradients for their all-reduce (which comes after); slack A
PEAK = 2 * W_RANK + 2 * BR * DIM * 8 + max(M * ACT + DIM * HS * 8, W_RANK) + ACT


class ThreeDParallel(PuzzleSpec):
    id, name, title = "p11", "three_d_parallel", "3-D parallelism (data × pipeline × tensor)"
    entries = ("build_3d_groups", "CopyToTPGroup", "ReduceFromTPGroup", "three_d_step")
    world_size = WORLD
    cost = COST
    simulator_only = ("bubble",)  # read off the simulated clock
    hints = ("Every rank calls new_group for every group, in the same order; it keeps the three it is in.",
             "f and g take the tensor-parallel group; the gradients' all-reduce takes the data-parallel group.",
             "Send to the rank of the next stage with your own replica and columns: peers of your pipeline group.")

    def make_inputs(self, seed):
        x, target = make_batch(B, DIM, seed)
        return {"layers": init_layers(L, DIM, H, seed + 1), "x": x, "target": target}

    def reference(self, inputs):
        return serial(inputs)

    def launch(self, inputs):
        per_rank = []
        for r in range(WORLD):
            pp, dp, _ = coords(r)
            per_rank.append(([(w1.requires_grad_(), w2.requires_grad_()) for w1, w2 in shard(inputs["layers"], r)],
                             inputs["x"][rows(dp)] if pp == 0 else None,
                             inputs["target"][rows(dp)] if pp == P - 1 else None))
        return (M, (MB, DIM)), per_rank

    def program(self, module):
        build, step = module.build_3d_groups, module.three_d_step

        def run(dist, n_micro, micro_shape, layers, x, target):
            for w1, w2 in layers:  # zeroed gradients, as after optimizer.zero_grad(set_to_none=False)
                w1.grad, w2.grad = torch.zeros_like(w1), torch.zeros_like(w2)
            groups = build(dist)
            described = groups_of(dist, groups)
            dx = step(dist, groups, layers, x, target, n_micro, micro_shape)
            return {"groups": described, "grads": [(w1.grad, w2.grad) for w1, w2 in layers], "input_grad": detached(dx)}

        return run

    def budgets(self, inputs):
        return {
            "tensor-parallel communication": Budget(
                "tensor-parallel communication", "2·m·(L/p)·2(t-1)/t·mb·d·8 + 1 KiB (an all-reduce of a [4, 64] "
                "activation per block per microbatch, forward and backward)", TP_BYTES + BOOKKEEPING_BYTES, "bytes"),
            "data-parallel communication": Budget(
                "data-parallel communication", "2(D-1)/D·W/(p·t) + 1 KiB (one all-reduce of the rank's gradients)",
                DP_BYTES + BOOKKEEPING_BYTES, "bytes"),
            "peak memory": Budget(
                "peak memory", "2·W/(p·t) + 2·b·d·8 + max(m·A + d·(h/t)·8, W/(p·t)) + A (weights and gradients, "
                "1/(p·t) of the model's each; x or target and dx; the larger of GPipe's m microbatches of "
                f"activations, A = {ACT:,} each, with a weight's fresh gradient, and a flat copy of the gradients "
                "for their all-reduce; A of slack)", PEAK, "bytes"),
            "compute": Budget("compute", f"m·(F + BW + LF + LB) + Ψ/(p·t) + m·mb·d (F = {FORWARD.flops:,}: one "
                              f"microbatch's forward through the stage's blocks with this rank's slices, BW = "
                              f"{BACKWARD.flops:,} its backward; the last stage's loss, LF + LB = "
                              f"{(LOSS_FORWARD + LOSS_BACKWARD).flops:,}; room for one elementwise op over the "
                              "rank's gradients and each microbatch's gradient)", SHARE_FLOPS, "count"),
            "bubble": Budget("bubble", "(p-1)/(m+p-1) + 1 point = 1/5 + 0.01",
                             float(Fraction(P - 1, M + P - 1) + TOLERANCE), "fraction"),
        }

    # ---- checks

    def check(self, obs: Observation, ref, inputs):
        budgets = self.budgets(inputs)
        grad_pairs, input_pairs = self.value_pairs(obs, ref)
        groups = groups_check(obs)
        tp = group_communication_check(obs, budgets["tensor-parallel communication"], "tensor-parallel communication",
                                       tp_ranks, "tensor-parallel",
                                       lambda r, by_kind, totals: diagnose_tp_bytes(obs, r, by_kind, totals))
        tp_sent = self.sent_on(obs, tp_ranks)
        dp = group_communication_check(obs, budgets["data-parallel communication"], "data-parallel communication",
                                       dp_ranks, "data-parallel",
                                       lambda r, by_kind, totals: diagnose_dp_bytes(obs, r, by_kind, totals, tp_sent))
        cause = {}

        def diagnose(_bad):  # one diagnosis for both value checks, from the whole picture, made once
            if "text" not in cause:
                cause["text"] = safe_diagnosis(self.diagnose_values, obs, ref, groups, dp, tp_sent, grad_pairs,
                                               input_pairs)
            return cause["text"]

        values = [values_check("stage gradients", grad_pairs, "stage gradients", diagnose),
                  values_check("input gradients", input_pairs, "input gradients", diagnose)]
        return [*values, groups, tp, dp,
                self.memory_check(obs, budgets["peak memory"]),
                compute_check(obs, budgets["compute"], self.diagnose_compute, least=PRODUCTS),
                self.bubble_check(obs, budgets["bubble"], all(c.passed for c in values))]

    @staticmethod
    def sent_on(obs, group_of) -> list[int]:
        return [sum(b for _, b in sent_on_group(obs, r, group_of(r)).values()) for r in range(obs.world_size)]

    @staticmethod
    def value_pairs(obs: Observation, ref):
        grad_pairs, input_pairs = [], []
        for r, res in enumerate(obs.results):
            res = res if isinstance(res, dict) else {}
            pp, dp, tp = coords(r)
            expected = sliced(ref["grads"], r)
            for j in range(PER):
                pair = pair_at(res.get("grads"), j)
                k = pp * PER + j
                cols, rws = f"[:, {tp * HS}:{(tp + 1) * HS}]", f"[{tp * HS}:{(tp + 1) * HS}, :]"
                grad_pairs.append((f"rank {r}: layers[{j}].w1.grad (block {k}, serial w1.grad{cols})", pair[0],
                                   expected[j][0], (r, j, "w1")))
                grad_pairs.append((f"rank {r}: layers[{j}].w2.grad (block {k}, serial w2.grad{rws})", pair[1],
                                   expected[j][1], (r, j, "w2")))
            what = "d(replica loss)/dx" if pp == 0 else f"d(replica loss)/d(stage {pp} input)"
            input_pairs.append((f"rank {r}: the returned input gradient ({what}, replica {dp})", res.get("input_grad"),
                                ref["input_grads"][dp][pp], (r, None, "input")))
        return grad_pairs, input_pairs

    # ---- the clock

    @staticmethod
    def relays(obs: Observation, rank: int):
        """The rank's share of its stage's work between the pipeline's messages (common/pipeline_schedule.py):
        its slice of each microbatch's forward, input gradient and weight gradients, a third of its products each."""
        pp, dp, tp = coords(rank)
        unit = PRODUCTS // M // 3
        return stage_relays(obs, rank, rank_of(pp - 1, dp, tp) if pp else None,
                            rank_of(pp + 1, dp, tp) if pp < P - 1 else None, M, ACTIVATION, unit, unit, unit)

    def bubble_check(self, obs: Observation, budget: Budget, values_right: bool = True) -> Check:
        unit = PRODUCTS // M // 3
        floor = peak_ticks((P - 1) * unit + M * 3 * unit, COST.device)
        refused = impossible(obs, lambda r: self.relays(obs, r), floor, "the products of (p-1) stage forwards and "
                             "the last stage's m forwards and backwards (a rank's slice)", budget, values_right)
        if refused is not None:
            return refused
        ideal = (M + P - 1) * (FORWARD + BACKWARD).ticks + M * (LOSS_FORWARD + LOSS_BACKWARD).ticks
        ends = [e["end"] for e in obs.events_of(stream="compute", kind="backward")]
        span = max(ends, default=0)
        busy = max((sum(e["end"] - e["start"] for e in obs.events_of(r, "compute") if e["end"] <= span)
                    for r in range(obs.world_size) if coords(r)[0] == P - 1), default=0)
        work = min(STAGE_WORK[P - 1].ticks, busy)  # the last stage's own work, with the loss: the busiest
        bubble = 1 - work / span if span else 0.0
        ok = bubble <= budget.value
        own = (f" (counted as its own compute by then, {fmt(busy, 'ticks')}, where that is less)"
               if busy < STAGE_WORK[P - 1].ticks else "")
        message = (f"the last backward ended at T_pipe = {fmt(span, 'ticks')}, against the last stage's own work of "
                   f"W = m·(F + BW + LF + LB) = {fmt(STAGE_WORK[P - 1].ticks, 'ticks')}{own}: a bubble of "
                   f"1 - W/T_pipe = "
                   f"{fmt(bubble, 'fraction')}, {'within' if ok else 'over'} the budget {budget.describe()} (a "
                   f"perfect {P}-stage pipeline of {M} microbatches takes about (m+p-1)·(F + BW) + m·(LF + LB) = "
                   f"{fmt(ideal, 'ticks')}; the whole step took {fmt(obs.makespan, 'ticks')} with the gradients' "
                   f"all-reduce). Compute per rank: {', '.join(f'{obs.busy_ticks(r):,}' for r in range(WORLD))} ticks")
        return Check("bubble", ok, message, measured=round(bubble, 6), budget=budget,
                     diagnosis="" if ok else safe_diagnosis(self.diagnose_bubble, obs))

    def diagnose_bubble(self, obs: Observation) -> str:
        busy = [obs.busy_ticks(r) for r in range(WORLD)]
        ends = [max((e["end"] for e in obs.events_of(r, "compute", "backward")), default=0) for r in range(WORLD)]
        piped = [sum(e["end"] - e["start"] for e in obs.events_of(r, "compute") if e["end"] <= ends[r])
                 for r in range(WORLD)]  # each rank's pipeline work, up to its last backward (before the update)
        if any(b > STAGE_WORK[coords(r)[0]].ticks * (1 + WORK_SLACK) for r, b in enumerate(piped)):
            return ("the ranks' compute took longer than their stage's work on the clock (see compute), and the "
                    "step took longer")
        sends = obs.events_of(0, "comm", "send")
        if len(sends) < M:
            return (f"rank 0 sent {len(sends)} activation(s) to stage 1; a pipeline of m = {M} microbatches sends "
                    f"{M}, each as soon as it is computed (one message of the replica's {BR} rows means only one "
                    f"stage works at a time)")
        sequence = work_sequence(obs, 0, FORWARD.flops, BACKWARD.flops)
        if "B" in sequence and sequence.index("B") <= 1:
            return ("rank 0 ran a backward right after its first forward: each microbatch goes through both stages "
                    "and back before the next starts, so only one stage works at a time")
        span = max((e["end"] for e in obs.events_of(stream="compute", kind="backward")), default=0)
        excess = span - (M + P - 1) * (FORWARD + BACKWARD).ticks  # beyond a perfect pipeline
        during = [sum(e["end"] - e["start"] for e in obs.events_of(r, "comm") if e["end"] <= span
                      and e["kind"] not in ("send", "recv") and [int(p) for p in e["peers"]] == dp_ranks(r))
                  for r in range(WORLD)]
        if excess > 0 and max(during) >= excess // 2:
            return (f"the data-parallel group's all-reduces ran during the pipeline, up to {max(during):,} ticks of "
                    f"them before the last backward ended, of the {excess:,} ticks the pipeline took beyond "
                    f"(m+p-1)·(F + BW): the gradients are all-reduced once, after every microbatch's backward")
        return ("the ranks idled " + ", ".join(f"rank {r}: {fmt(1 - b / obs.makespan, 'fraction')}"
                                               for r, b in enumerate(busy)) + " of the step: look at the schedule "
                "chart for where a rank waits on a message it could have had earlier")

    # ---- memory and compute

    def memory_check(self, obs: Observation, budget: Budget) -> Check:
        over = [(r, p) for r, p in enumerate(obs.peak_bytes) if p > budget.value]
        if not over:
            worst = max(obs.peak_bytes)
            return Check("peak memory", True, f"largest peak {fmt(worst, 'bytes')}, within the budget "
                                              f"{budget.describe()}", measured=worst, budget=budget)
        r, peak = max(over, key=lambda x: x[1])
        top = obs.ledgers[r].get("peak_by_line", [])[:2]
        lines = "; ".join(f"{e['site']} ({fmt(e['bytes'], 'bytes')})" for e in top)
        message = (f"rank {r} peaked at {fmt(peak, 'bytes')}, over the budget {budget.describe()}. Largest at the "
                   f"peak: {lines}")
        return Check("peak memory", False, message, measured=peak, budget=budget,
                     diagnosis=safe_diagnosis(self.diagnose_memory, obs, r))

    @staticmethod
    def diagnose_memory(obs: Observation, rank: int) -> str:
        """Weights are named only when the rank also gathered within its pair or multiplied full weights."""
        gathered = any(e["kind"].startswith("all_gather") for e in obs.events_of(rank, "comm"))
        if gathered or flops(obs, rank) >= T * STAGE_WORK[coords(rank)[0]].flops:
            return (f"the rank held more than its 1/(p·t) of the weights (W/(p·t) = {W_RANK:,} bytes; its stage's "
                    f"full weights are {T * W_RANK:,}) and {'gathered' if gathered else 'multiplied'} full "
                    f"weights: tensor parallelism keeps w1_r and w2_r as they are and all-reduces activations")
        return ""

    @staticmethod
    def diagnose_compute(rank, fwd, bwd) -> str:
        total, share, f = fwd + bwd, STAGE_WORK[coords(rank)[0]].flops, FORWARD.flops
        if abs(total - T * share) < f:
            return (f"rank {rank} computed {T}x its share: the work of its whole tensor-parallel pair, as with the "
                    f"full weights of its stage. Each rank multiplies its own slices only; g's all-reduce adds the halves")
        if abs(total - sum(w.flops for w in STAGE_WORK)) < f:
            return f"rank {rank} computed the blocks of both stages"
        if abs(fwd - 2 * M * f) < f and abs(bwd - M * BACKWARD.flops) < f:
            return (f"rank {rank} ran every microbatch's forward twice: recomputation, which this puzzle does not "
                    f"ask for")
        return (f"rank {rank} computed {fwd / f:.1f} microbatch forwards' worth outside backward and "
                f"{bwd / BACKWARD.flops:.1f} backwards' worth inside it; a stage runs m = {M} of each")

    # ---- what wrong values say

    def diagnose_values(self, obs, ref, groups: Check, dp: Check, tp_sent, grad_pairs, input_pairs) -> str:
        if not groups.passed:
            text = diagnose_groups_briefly(groups)
            return f"follows from the process groups (see that check): {text}"
        if not dp.passed and all(t == 0 for t in tp_sent) and sized_like(dp.measured - DP_BYTES, {"a": TP_BYTES}):
            return ("the tensor-parallel all-reduces ran on the data-parallel group: f and g summed halves of "
                    "different replicas' activations (see data-parallel communication)")
        bad_grads = [(m, g, e) for _, g, e, m in grad_pairs if tensor_mismatch(g, e) is not None]
        bad_inputs = [(m, g, e) for _, g, e, m in input_pairs if tensor_mismatch(g, e) is not None]
        factors = {round(k, 9) if k is not None else None for _, g, e in bad_grads + bad_inputs
                   for k in [ratio(g, e)]}
        if len(factors) == 1 and None not in factors:
            k = factors.pop()
            if not bad_inputs and abs(k - D) < 1e-6:
                return (f"every wrong weight gradient is exactly {D}x the serial one and the input gradients are "
                        f"right: the gradients were summed across the {D} replicas, not averaged. The full-batch "
                        f"loss is the mean of the replicas' losses: divide the all-reduced sum by {D}")
            if not bad_inputs and abs(k - 1 / D) < 1e-9:
                return f"every wrong weight gradient is exactly 1/{D} of the serial one: averaged twice?"
            if abs(k - M) < 1e-6:
                return (f"exactly {M}x the reference everywhere: the microbatch losses were added, not averaged; "
                        f"scale each microbatch's loss by 1/m = 1/{M}")
            if abs(k - 1 / D) < 1e-9 and bad_inputs:
                which = (f"every gradient, the input gradients too, is exactly 1/{D} of the serial one" if bad_grads
                         else f"the input gradients are exactly 1/{D} of the serial ones, the weight gradients right")
                summed = ("" if bad_grads else " (and the weight gradients summed over the replicas, not averaged, "
                                               "which made up for it on the weights)")
                return (f"{which}: each microbatch's loss was divided by {D} more than by m, by the number of "
                        f"replicas for the whole batch's mean{summed}? A replica's loss is the mean over its own "
                        f"rows, loss_fn(y, target_i) / m (the input gradients are of it); averaging the weight "
                        f"gradients over the {D} replicas makes the full-batch mean. ({D} is also the number of "
                        f"stages and of tensor-parallel ranks here: a division by either does the same)")
            return f"every wrong gradient is exactly {k:g}x the serial one"
        if bad_grads and not bad_inputs and all(self.is_local(obs, ref, m[0]) for m, _, _ in bad_grads):
            return ("the weight gradients are each replica's own, never combined: all-reduce them on the "
                    "data-parallel group and divide by its size")
        return ""

    @staticmethod
    def is_local(obs, ref, rank) -> bool:
        got = obs.results[rank].get("grads") if isinstance(obs.results[rank], dict) else None
        _, dp, _ = coords(rank)
        local = sliced(ref["local_grads"][dp], rank)
        return all(tensor_mismatch(pair_at(got, j)[k], local[j][k]) is None for j in range(PER) for k in range(2))


def diagnose_groups_briefly(groups: Check) -> str:
    return groups.diagnosis or "values of other replicas, stages or columns were mixed in"


SPEC = ThreeDParallel()
