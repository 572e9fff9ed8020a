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

import torch
import torch.utils.data as tud

from puzzles.model import forward, loss_fn
from puzzles.sim import CostModel

from ...core.compare import TOLERANCE_TEXT, safe_diagnosis, tensor_mismatch
from ...core.result import Budget, Check, fmt
from ...core.rules import BOOKKEEPING_BYTES, communication_check
from ...core.spec import Observation, PuzzleSpec, pair_at
from . import layout as lay

NETWORK = {"latency_ticks": 8, "bytes_per_tick": 512}  # puzzle 8's network


class StepBatch(tud.Dataset):
    """One step's global batch of B rows: `batch[i]`, `batch[lo:hi]`, `batch[[i, j]]` give (x rows, target rows).
    It notes which rows the rank read, for the check that every row is read by exactly one rank."""

    def __init__(self, x: torch.Tensor, target: torch.Tensor):
        self._x, self._target, self._read = x, target, set()

    def __len__(self) -> int:
        return self._x.shape[0]

    def __getitem__(self, index):
        n = len(self)
        if isinstance(index, slice):
            rows = range(n)[index]
        elif isinstance(index, int):
            rows = [index % n]
        elif isinstance(index, torch.Tensor) and index.dtype == torch.bool:
            rows = [i for i, keep in enumerate(index.tolist()) if keep]
        else:
            rows = [int(i) % n for i in (index.tolist() if isinstance(index, torch.Tensor) else index)]
        self._read.update(rows)
        return self._x[index], self._target[index]

    def rows_read(self) -> list[int]:
        return sorted(self._read)


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
            batches = [StepBatch(x[s * lay.B:(s + 1) * lay.B], target[s * lay.B:(s + 1) * lay.B])
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
        return [self.check_weights(res, ref, inputs), self.check_rows(res),
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
                                     diagnosis=safe_diagnosis(_weights_diagnosis, res, rank, inputs))
        return Check(name, True, f"every rank's weights after the {lay.STEPS} steps match the serial run "
                                 f"({TOLERANCE_TEXT})")

    def check_rows(self, res) -> Check:
        name = "every row once"
        for s in range(lay.STEPS):
            readers: dict[int, list[int]] = {}
            for rank, r in enumerate(res):
                for i in _rows_at(r, s):
                    readers.setdefault(i, []).append(rank)
            twice = {i: rs for i, rs in readers.items() if len(rs) > 1}
            missing = [i for i in range(lay.B) if i not in readers]
            if twice:
                pairs = sorted({tuple(rs) for rs in twice.values()})
                return Check(name, False, f"at step {s}, {len(twice)} rows were read by more than one rank: "
                             f"{_rows(sorted(twice))} (by ranks {', '.join(' and '.join(map(str, p)) for p in pairs)})."
                             f" Each row of a step's batch is one rank's: the ranks' ranges must not overlap.",
                             diagnosis=_overlap_diagnosis(twice))
            if missing:
                return Check(name, False, f"at step {s}, {len(missing)} of the batch's {lay.B} rows were read by "
                             f"no rank: {_rows(missing)}. Every row counts in the step's loss: the ranks' ranges "
                             f"must cover 0..{lay.B - 1}.", diagnosis=_missing_diagnosis(res, s, missing))
        return Check(name, True, f"at each of the {lay.STEPS} steps, every one of the batch's {lay.B} rows was read "
                                 f"by exactly one rank")

    def check_balance(self, obs: Observation, budget: Budget, inputs) -> Check:
        waited = {r: _waited(obs, r) for r in range(obs.world_size)}
        rank = max(waited, key=waited.get)
        ok = waited[rank] <= budget.value
        table = _table(obs, waited)
        message = (f"rank {rank}'s device sat idle {fmt(waited[rank], 'ticks')} waiting in its collectives for the "
                   f"last rank to arrive, {'within' if ok else 'over'} the budget {budget.describe()}. {table}")
        diagnosis = "" if ok else safe_diagnosis(_balance_diagnosis, obs, waited, inputs["slow_rank"])
        return Check("balance", ok, message, measured=waited[rank], budget=budget, diagnosis=diagnosis)

    def check_makespan(self, obs: Observation, budget: Budget, inputs) -> Check:
        ok = obs.makespan <= budget.value
        message = f"the run took {fmt(obs.makespan, 'ticks')}, {'within' if ok else 'over'} the budget " \
                  f"{budget.describe()}"
        diagnosis = "" if ok else safe_diagnosis(_makespan_diagnosis, obs, inputs["slow_rank"])
        return Check("makespan", ok, message, measured=obs.makespan, budget=budget, diagnosis=diagnosis)


# ---- what the clock shows


def _waited(obs: Observation, rank: int) -> int:
    """Ticks the rank's device sat idle waiting for a partner: its compute stream ran nothing while a collective of
    its own could have started (issued, and the rank's previous message done: its own queue is no partner's
    lateness) but had not, because the last rank had not arrived. A profiler shows it as a long all-reduce kernel
    on every rank but the late one. An async collective that waits while the rank computes costs nothing."""
    spans, free = [], 0
    for e in sorted(obs.events_of(rank, "comm"), key=lambda e: (e["start"], e["end"])):
        ready = max(e["issued"], free)
        if e["start"] > ready:
            spans.append([ready, e["start"]])
        free = max(free, e["end"])
    merged: list[list[int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    busy = [(e["start"], e["end"]) for e in obs.events_of(rank, "compute")]
    return sum((b - a) - sum(max(0, min(b, d) - max(a, c)) for c, d in busy) for a, b in merged)


def _table(obs: Observation, waited: dict[int, int]) -> str:
    return "Per rank, compute and idle waiting: " + "; ".join(
        f"rank {r} {obs.busy_ticks(r):,} and {waited[r]:,}" for r in range(obs.world_size)) + " ticks."


def _balance_diagnosis(obs: Observation, waited: dict[int, int], slow: int) -> str:
    """Who waited for whom. `slow`: the rank whose device is slow at this seed (the cost model's)."""
    busy = {r: obs.busy_ticks(r) for r in range(obs.world_size)}
    if max(waited, key=waited.get) == slow:
        return (f"rank {slow}, whose device is the slow one at this seed, waited longest ({waited[slow]:,} ticks) "
                f"while computing least ({busy[slow]:,} ticks): it has less work than its speed allows (left out, "
                f"or given too few rows). Its device is slower, not stopped: give it rows in proportion to its "
                f"speed, and the others fewer.")
    late = max(busy, key=busy.get)  # the rank the others waited for
    if late == slow:
        return (f"the others waited for rank {slow} at each all-reduce: it computed longest ({busy[slow]:,} ticks). "
                f"At this seed its device is the slow one; at another seed another rank's is, so find it in the "
                f"program (time each rank's device with cuda.Event, all-gather the times) and give each rank rows "
                f"in proportion to its speed.")
    return (f"the others waited for rank {late} at each all-reduce: it computed longest ({busy[late]:,} ticks), with "
            f"more rows than its speed allows (its device is not the slow one at this seed: rank {slow}'s is). Time "
            f"each rank's device and give each rows in proportion to its speed.")


def _makespan_diagnosis(obs: Observation, slow: int) -> str:
    waited = {r: _waited(obs, r) for r in range(obs.world_size)}
    if max(waited.values()) > lay.WAIT_BUDGET:
        return _balance_diagnosis(obs, waited, slow)
    return (f"no rank waited long for another, but the run is long all the same: {_table(obs, waited)} A step "
            f"balanced by speed takes the slow rank C = {lay.C:,} ticks (its {lay.BALANCED[1]} rows); a probe costs "
            f"at most P = {lay.P:,}: time a few rows, once, and compute each row once.")


# ---- the rows each rank read


def _rows_at(r: dict, s: int) -> list[int]:
    """The rows of step s's batch that a rank read (the harness's record)."""
    rows = r.get("rows") or []
    return rows[s] if s < len(rows) else []


def _rows(rows: list[int]) -> str:
    """Row numbers as ranges: '22, 44..47'."""
    parts, start = [], None
    for i, row in enumerate(rows):
        if start is None:
            start = row
        if i + 1 == len(rows) or rows[i + 1] != row + 1:
            parts.append(f"{start}" if start == row else f"{start}..{row}")
            start = None
    return ", ".join(parts)


def _overlap_diagnosis(twice: dict[int, list[int]]) -> str:
    if len(twice) <= lay.N - 1 and all(len(rs) == 2 and rs[1] == rs[0] + 1 for rs in twice.values()):
        return ("each boundary row is read by both neighbours: rank r's rows are bounds[r]..bounds[r+1]-1, so "
                "slice batch[bounds[r]:bounds[r + 1]] (the end excluded), with bounds the running sum of the counts.")
    if all(len(rs) == lay.N for rs in twice.values()):
        whole = len(twice) == lay.B
        return (("every rank read the whole batch: each rank computes its own share of the rows, and the "
                 "all-reduce adds the shares. " if whole else "every rank read the same few rows (a probe?). ")
                + "A probe that times the device runs on rows of its own (torch.zeros), not on the batch's, whose "
                  "rows are each one rank's.")
    return ""


def _missing_diagnosis(res, s: int, missing: list[int]) -> str:
    empty = [rank for rank, r in enumerate(res) if not _rows_at(r, s)]
    if empty and len(missing) < lay.B:
        return (f"rank {empty[0]} read no row at step {s}, and its rows were left to nobody: a slow rank is slower, "
                f"not absent. Give it fewer rows (in proportion to its speed), and give every row to some rank.")
    if len(missing) < lay.N:
        return ("a row or so at the end of the ranges is nobody's: counts rounded down add up to less than B. Round "
                "so that they add up to B (give the rows left over, one each, to the ranks whose shares were rounded "
                "down most).")
    if len(missing) == lay.B:
        return ("no rank read the batch through it (batch[lo:hi] reads rows lo..hi-1; its tensors are not to be "
                "taken directly).")
    return ""


def _weights_diagnosis(res, rank: int, inputs) -> str:
    """A mean of means: each rank's own mean loss, the ranks' gradients averaged. Replayed with the rows each rank
    read; named only when it gives the rank's weights."""
    rows = [r.get("rows") or [] for r in res]
    if any(len(x) != lay.STEPS for x in rows):
        return ""
    layers = inputs["layers"]
    for s in range(lay.STEPS):
        x, target = lay.step_batch(inputs, s)
        shares = [rows[r][s] for r in range(lay.N) if rows[r][s]]
        ws = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_()) for w1, w2 in layers]
        loss = sum(loss_fn(forward(x[idx], ws), target[idx]) for idx in shares) / lay.N
        grads = torch.autograd.grad(loss, [w for pair in ws for w in pair])
        with torch.no_grad():
            layers = [(w1 - lay.LR * g1, w2 - lay.LR * g2) for (w1, w2), g1, g2 in zip(ws, grads[0::2], grads[1::2])]
    got = res[rank].get("weights") or []
    if all(tensor_mismatch(g, e) is None for i, want in enumerate(layers) for g, e in zip(pair_at(got, i), want)):
        return ("each rank averaged its loss over its own rows and the ranks' gradients were averaged (a mean of "
                "means): with shares of different sizes, that weighs a row of the slow rank's 1/(N·n_slow), more "
                "than a fast rank's. Weigh each rank's loss by its share, n_r/B, and add the gradients (SUM).")
    return ""


SPEC = Straggler()
