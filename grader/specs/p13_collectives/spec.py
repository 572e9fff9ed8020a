"""p13 collectives from point-to-point: an all-reduce written with send/recv only, as a ring (reduce-scatter then
all-gather, 2(N-1) steps of a chunk) and by recursive doubling (log2 N exchanges of the whole tensor).

Each function is graded in eight runs (runs.py): in a world of 8 ranks and in two worlds of 4 at once,
at 4 KiB and 512 KiB, the two sides of the sizes where one algorithm beats the other on the puzzle's network. The
rules, each measured per run as such: the values (every rank's t holds its world's sum); no collective called;
the bytes each rank sends, exactly the algorithm's (on the ring, to its two ring neighbours only); the makespan
within the α-β formula, the reductions it leaves out and a stated tolerance; the memory held beyond t in the call.
"""

from __future__ import annotations

import torch

from ...core.compare import safe_diagnosis, values_check
from ...core.probe import ledger_mark
from ...core.result import Budget, Check
from ...core.spec import Observation, PuzzleSpec
from .mistakes import (diagnose_bytes, diagnose_held, diagnose_schedule, diagnose_values, misdirected, sent_in)
from .runs import (COST, FUNCTIONS, RUNS, TOLERANCE_PERCENT, WORLD, Run, comm_by_run, held_beyond, is_harness_barrier,
                   run_makespan)
from .sub_world import sub_world

HALVES = ((0, 1, 2, 3), (4, 5, 6, 7))
POINT_TO_POINT = ("send", "recv", "new_group")


def bytes_formula(run: Run) -> str:
    if run.algorithm == "ring":
        return f"2(N-1)/N·S = {2 * (run.n - 1)}·{run.message_bytes:,}"
    return f"log2(N)·S = {run.steps}·{run.nbytes:,}"


def makespan_formula(run: Run) -> str:
    steps = "2(N-1)(α + S/(Nβ))" if run.algorithm == "ring" else "log2(N)(α + S/β)"
    adds = "(N-1) adds of a chunk" if run.algorithm == "ring" else "log2(N) adds of the tensor"
    return (f"{steps} + {adds} + {TOLERANCE_PERCENT}% = {run.alpha_beta_ticks:,} + {run.reduction_ticks:,} + "
            f"{run.tolerance_ticks:,}")


def held_formula(run: Run) -> str:
    return ("2·S/N + 1 KiB (two chunk-sized buffers)" if run.algorithm == "ring" else
            "2·S + 1 KiB (two buffers the size of t)")


class Collectives(PuzzleSpec):
    id, name, title = "p13", "collectives", "Collectives from send/recv"
    entries = tuple(FUNCTIONS.values())
    world_size = WORLD
    cost = COST
    simulator_only = ("ring makespan", "doubling makespan")
    hints = ("Ring step k: send chunk (r - k) to the right and receive chunk (r - k - 1) from the left, both at once "
             "(isend + irecv, then wait for both), then add what arrived into your chunk.",
             "Recursive doubling: in round k, exchange the whole running sum with rank r ^ 2**k and add.")

    def make_inputs(self, seed):
        g = torch.Generator().manual_seed(seed)
        return {"tensors": [[torch.randn(run.shape, generator=g, dtype=torch.float64) for _ in range(WORLD)]
                            for run in RUNS]}

    def reference(self, inputs):
        sums = []
        for run, tensors in zip(RUNS, inputs["tensors"]):
            sums.append([torch.stack([tensors[s] for s in run.world_of(r)]).sum(0) for r in range(WORLD)])
        return {"sums": sums}

    def launch(self, inputs):
        return (), [([tensors[r] for tensors in inputs["tensors"]],) for r in range(WORLD)]

    def program(self, module):
        functions = {algorithm: getattr(module, name) for algorithm, name in FUNCTIONS.items()}

        def run(dist, tensors):
            halves = {ranks: dist.new_group(list(ranks)) for ranks in HALVES}  # every rank makes both
            rank, out = dist.get_rank(), {"t": [], "returned": [], "marks": []}
            for one, t in zip(RUNS, tensors):
                ranks = one.world_of(rank)
                world = sub_world(dist, ranks, None if one.n == WORLD else halves[ranks])
                dist.barrier()
                start = ledger_mark()
                returned = functions[one.algorithm](world, t)
                end = ledger_mark()
                out["t"].append(t)
                out["returned"].append(returned if isinstance(returned, torch.Tensor) else None)
                out["marks"].append((start, end))
            dist.barrier()
            return out

        return run

    def budgets(self, inputs):
        budgets = {}
        for run in RUNS:
            budgets[f"{run.key}: bytes"] = Budget(f"{run.algorithm} bytes", f"exactly {bytes_formula(run)}",
                                                  run.sent_bytes, "bytes")
            budgets[f"{run.key}: makespan"] = Budget(f"{run.algorithm} makespan", makespan_formula(run),
                                                     run.makespan_budget, "ticks")
            budgets[f"{run.key}: memory"] = Budget(f"{run.algorithm} memory", held_formula(run), run.held_budget,
                                                   "bytes")
        return budgets

    def check(self, obs: Observation, ref, inputs):
        budgets = self.budgets(inputs)
        checks = []
        for algorithm in FUNCTIONS:
            checks.append(self.values(obs, ref, inputs, algorithm))
        checks.append(self.no_collective(obs))
        for algorithm in FUNCTIONS:
            checks += [self.sent(obs, budgets, algorithm), self.makespan(obs, budgets, algorithm),
                       self.memory(obs, budgets, algorithm)]
        return checks

    # ---- the checks

    def values(self, obs: Observation, ref, inputs, algorithm: str) -> Check:
        pairs = []
        for i, run in _runs(algorithm):
            for r in range(WORLD):
                got = _result(obs, r, i).get("t")
                pairs.append((f"{run.key}: rank {r}'s t", got, ref["sums"][i][r], (i, r)))
        diagnose = lambda bad: diagnose_values(bad, obs, inputs, _result)  # noqa: E731
        return values_check(f"{algorithm} values", pairs, f"t after {FUNCTIONS[algorithm]}", diagnose)

    @staticmethod
    def no_collective(obs: Observation) -> Check:
        used = [e for e in obs.events_of(stream="comm") if e["kind"] not in POINT_TO_POINT
                and not is_harness_barrier(e)]
        if not used:
            return Check("no collective", True, "every rank communicated with send and recv only (isend, irecv, "
                                                "batch_isend_irecv)")
        first = used[0]
        kinds = sorted({e["kind"] for e in used})
        return Check("no collective", False,
                     f"{len(used)} collective call(s) ({', '.join(kinds)}); the first on rank {first['rank']} at "
                     f"{first.get('site') or '?'}", measured=len(used),
                     diagnosis=f"this puzzle builds the all-reduce out of send and recv: {', '.join(kinds)} is a "
                               f"collective, which is what you are writing")

    def sent(self, obs: Observation, budgets, algorithm: str) -> Check:
        rows, off = [], []
        for i, run in _runs(algorithm):
            totals = [sent_in(comm_by_run(obs, r)[i]) for r in range(WORLD)]
            wrong = [r for r in range(WORLD) if totals[r] != run.sent_bytes]
            strays = misdirected(obs, i, run) if algorithm == "ring" else []
            r = wrong[0] if wrong else strays[0][0] if strays else 0
            if wrong or strays:
                off.append((i, run, r, totals[r]))
            rows.append(f"{run.key}: {totals[r]:,} (rank {r}) of exactly {run.sent_bytes:,}"
                        + (f", and rank {strays[0][0]} sent to rank(s) {strays[0][1]}" if strays else ""))
        i, run, r, measured = off[0] if off else (None, RUNS[_runs(algorithm)[-1][0]], 0, None)
        diagnosis = "" if not off else safe_diagnosis(diagnose_bytes, obs, i, run, r)
        where = " (every send to a ring neighbour, the next rank or the previous one)" if algorithm == "ring" else ""
        return Check(f"{algorithm} bytes", not off, f"bytes each rank sent per run{where}: {'; '.join(rows)}",
                     measured=run.sent_bytes if measured is None else measured,
                     budget=budgets[f"{run.key}: bytes"], diagnosis=diagnosis)

    def makespan(self, obs: Observation, budgets, algorithm: str) -> Check:
        rows, off, spans = [], [], {}
        for i, run in _runs(algorithm):
            spans[i] = max(run_makespan(obs, i, world) for world in _worlds(run))
            if spans[i] > run.makespan_budget:
                off.append((i, run))
            rows.append(f"{run.key}: {spans[i]:,} ticks (α-β formula {run.alpha_beta_ticks:,}, budget "
                        f"{run.makespan_budget:,})")
        i, run = off[0] if off else _runs(algorithm)[-1]
        diagnosis = "" if not off else safe_diagnosis(diagnose_schedule, obs, i, run)
        return Check(f"{algorithm} makespan", not off, f"each run's makespan, its slowest world: {'; '.join(rows)}",
                     measured=spans[i], budget=budgets[f"{run.key}: makespan"], diagnosis=diagnosis)

    def memory(self, obs: Observation, budgets, algorithm: str) -> Check:
        rows, off, most = [], [], {}
        for i, run in _runs(algorithm):
            held = [held_beyond(obs, r, _result(obs, r, i).get("marks")) for r in range(WORLD)]
            r = max(range(WORLD), key=held.__getitem__)
            most[i] = held[r]
            if held[r] > run.held_budget:
                off.append((i, run))
            rows.append(f"{run.key}: {held[r]:,} (rank {r}; budget {run.held_budget:,})")
        i, run = off[0] if off else _runs(algorithm)[-1]
        diagnosis = "" if not off else safe_diagnosis(diagnose_held, run, most[i])
        return Check(f"{algorithm} memory", not off,
                     f"bytes held during the call beyond what the rank held before it (t, the inputs of the other "
                     f"runs), the most on any rank: {'; '.join(rows)}", measured=most[i],
                     budget=budgets[f"{run.key}: memory"], diagnosis=diagnosis)


def _runs(algorithm: str) -> list[tuple[int, Run]]:
    """(index among RUNS, run) for each run of `algorithm`."""
    return [(i, run) for i, run in enumerate(RUNS) if run.algorithm == algorithm]


def _worlds(run: Run) -> list[tuple[int, ...]]:
    return [tuple(range(w, w + run.n)) for w in range(0, WORLD, run.n)]


def _result(obs: Observation, rank: int, i: int) -> dict:
    """What the program noted for run i on `rank`: {"t", "returned", "marks"} (an item missing when there is none)."""
    per_rank = obs.results[rank] if rank < len(obs.results) else None
    out = {}
    for key in ("t", "returned", "marks"):
        items = per_rank.get(key) if isinstance(per_rank, dict) else None
        if isinstance(items, (list, tuple)) and i < len(items):
            out[key] = items[i]
    return out

SPEC = Collectives()
