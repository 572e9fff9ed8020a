"""p23 the straggler: a data-parallel run in which one rank's device is K = 3/2 times as slow as the others', so
every step waits for it at the gradients' all-reduce. Which rank is slow comes from the seed (the cost model's
slow_ranks, spec.cost_for), so a fix that names a rank fails at another seed: the program must find the slow rank
at run time (sim.cuda.Event, torch.cuda.Event's mirror) and give each rank rows in proportion to its speed.

The rules, each measured as such: every rank's weights after the S steps against the serial run on each step's whole
batch (so rows split unevenly must be weighed by their count, not averaged as a mean of means); every row of each
step's batch read by exactly one rank (the harness's batch notes the rows each rank reads: a split that drops or
repeats rows at its boundaries, or leaves the slow rank's rows to nobody, fails here with the rows); the bytes each
rank sends (each step's gradients once); how long any rank's device sits idle waiting in its collectives for the
last one to arrive (the cause's own measure: a rank with more work than its speed allows makes the others wait; one
with less, the slow rank dropped, waits itself); and the makespan against a formula of the balanced step. The last
two need the simulated clock: real processes on one CPU are not slowed (the cost model says who is) and lay each
rank's compute end to end, without waits.
"""

from __future__ import annotations

from puzzles.sim import CostModel

from ...core.compare import TOLERANCE_TEXT, safe_diagnosis, tensor_mismatch
from ...core.result import Budget, Check, fmt
from ...core.rules import BOOKKEEPING_BYTES, communication_check
from ...core.spec import Observation, PuzzleSpec, pair_at
from . import layout as lay
from .diagnoses import (balance_diagnosis, describe_rows, idle_waiting, makespan_diagnosis, missing_diagnosis,
                        overlap_diagnosis, rows_at, timings, weights_diagnosis)

NETWORK = {"latency_ticks": 8, "bytes_per_tick": 512}  # puzzle 8's network


class Straggler(PuzzleSpec):
    id, name, title = "p23", "straggler", "The straggler (one slow rank, found by timing)"
    entries = ("train_balanced",)
    world_size = lay.N
    cost = CostModel(**NETWORK)
    simulator_only = ("balance", "makespan")
    hints = ("The check's table gives each rank's compute and the ticks it waited in its collectives: the rank the "
             "others wait for is the slow one, at this seed. Another seed slows another rank: time each rank's "
             "device in the program (cuda.Event(enable_timing=True), record before and after a probe) and "
             "all-gather the times.",
             "Give each rank rows in proportion to 1/time (round so that the counts add up to B), and weigh each "
             "rank's loss by its share of the batch, n_r/B, so that the all-reduced (SUM) gradient is the whole "
             "batch's mean.")

    def cost_for(self, inputs):
        return CostModel(**NETWORK, slow_ranks=((inputs["slow_rank"], lay.K),))

    def make_inputs(self, seed):
        return lay.make_inputs(seed)

    def reference(self, inputs):
        return lay.reference_run(inputs)

    def launch(self, inputs):
        return (inputs["lr"],), [(inputs["x"], inputs["target"], inputs["layers"])] * lay.N

    def program(self, module):
        train = getattr(module, self.entries[0])

        def run(dist, lr, x, target, layers):
            layers = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_())
                      for w1, w2 in layers]
            batches = [lay.StepBatch(x[s * lay.B:(s + 1) * lay.B], target[s * lay.B:(s + 1) * lay.B])
                       for s in range(lay.STEPS)]
            train(dist, batches, layers, lr)
            return {"weights": [(w1.detach().clone(), w2.detach().clone()) for w1, w2 in layers],
                    "rows": [b.rows_read() for b in batches]}

        return run

    def budgets(self, inputs):
        return {
            "communication": Budget(
                "communication", f"S·2(N-1)/N·G + {BOOKKEEPING_BYTES:,} bytes: S = {lay.STEPS} steps, each one "
                f"all-reduce of the gradients (G = 2·L·d·h·8 = {lay.GRADIENT_BYTES:,} bytes); 1 KiB for scalars "
                f"such as the ranks' timings", lay.STEPS * lay.ALL_REDUCE_BYTES + BOOKKEEPING_BYTES, "bytes"),
            "balance": Budget(
                "balance", f"20% of S·C: S = {lay.STEPS} steps of the balanced step's compute C = {lay.C:,} ticks",
                lay.WAIT_BUDGET, "ticks"),
            "makespan": Budget(
                "makespan", f"P + S·(C + A) + T: a probe P = {lay.P:,} (a forward and backward on 8 rows, on the "
                f"slow rank), S = {lay.STEPS} balanced steps of C = {lay.C:,} (the slow rank's {lay.BALANCED[1]} "
                f"rows, K = {lay.K}) and the gradients' all-reduce A = {lay.A:,}, T = 5% of S·C = {lay.TOLERANCE:,}",
                lay.MAKESPAN_BUDGET, "ticks")}

    # ---- checks

    def check(self, obs: Observation, ref, inputs):
        res = [r if isinstance(r, dict) else {} for r in obs.results]
        budgets = self.budgets(inputs)
        return [self.check_weights(res, ref, inputs), self.check_rows(res, inputs),
                communication_check(obs, budgets["communication"]),
                self.check_balance(obs, budgets["balance"], inputs),
                self.check_makespan(obs, budgets["makespan"], inputs)]

    def check_weights(self, res, ref, inputs) -> Check:
        name = "weights"
        for rank, r in enumerate(res):
            got = r.get("weights") or []
            for i, want in enumerate(ref["weights"]):
                for k, (g, e) in enumerate(zip(pair_at(got, i), want)):
                    problem = tensor_mismatch(g, e)
                    if problem is not None:
                        return Check(name, False, f"rank {rank}'s layers[{i}].{('w1', 'w2')[k]} after the "
                                     f"{lay.STEPS} steps {problem} (the serial run: SGD, lr {lay.LR}, on the loss "
                                     f"of each step's whole batch, averaged over its {lay.B} rows).",
                                     diagnosis=safe_diagnosis(weights_diagnosis, res, rank, inputs))
        return Check(name, True, f"every rank's weights after the {lay.STEPS} steps match the serial run "
                                 f"({TOLERANCE_TEXT})")

    def check_rows(self, res, inputs) -> Check:
        name = "every row once"
        for s in range(lay.STEPS):
            readers: dict[int, list[int]] = {}
            for rank, r in enumerate(res):
                for i in rows_at(r, s):
                    readers.setdefault(i, []).append(rank)
            twice = {i: rs for i, rs in readers.items() if len(rs) > 1}
            missing = [i for i in range(lay.B) if i not in readers]
            if twice:
                pairs = sorted({tuple(rs) for rs in twice.values()})
                by = ", ".join(" and ".join(map(str, p)) for p in pairs)
                return Check(name, False, f"at step {s}, {len(twice)} rows were read by more than one rank: "
                             f"{describe_rows(sorted(twice))} (by ranks {by}). Each row of a step's batch is one "
                             f"rank's: the ranks' ranges must not overlap.", diagnosis=overlap_diagnosis(twice))
            if missing:
                return Check(name, False, f"at step {s}, {len(missing)} of the batch's {lay.B} rows were read by "
                             f"no rank: {describe_rows(missing)}. Every row counts in the step's loss: the ranks' "
                             f"ranges must cover 0..{lay.B - 1}.",
                             diagnosis=missing_diagnosis(res, s, missing, inputs["slow_rank"]))
        return Check(name, True, f"at each of the {lay.STEPS} steps, every one of the batch's {lay.B} rows was read "
                                 f"by exactly one rank")

    def check_balance(self, obs: Observation, budget: Budget, inputs) -> Check:
        waited = {r: idle_waiting(obs, r) for r in range(obs.world_size)}
        rank = max(waited, key=waited.get)
        ok = waited[rank] <= budget.value
        table = timings(obs, waited)
        message = (f"rank {rank}'s device sat idle {fmt(waited[rank], 'ticks')} waiting in its collectives for the "
                   f"last rank to arrive, {'within' if ok else 'over'} the budget {budget.describe()}. {table}")
        diagnosis = "" if ok else safe_diagnosis(balance_diagnosis, obs, waited, inputs["slow_rank"])
        return Check("balance", ok, message, measured=waited[rank], budget=budget, diagnosis=diagnosis)

    def check_makespan(self, obs: Observation, budget: Budget, inputs) -> Check:
        ok = obs.makespan <= budget.value
        message = f"the run took {fmt(obs.makespan, 'ticks')}, {'within' if ok else 'over'} the budget " \
                  f"{budget.describe()}"
        diagnosis = "" if ok else safe_diagnosis(makespan_diagnosis, obs, inputs["slow_rank"])
        return Check("makespan", ok, message, measured=obs.makespan, budget=budget, diagnosis=diagnosis)


SPEC = Straggler()
