"""How long grading takes, and the simulated figures next to the textbook formulas.

    python bench/bench_grading.py

1. Wall time of grading the reference solutions (`python -m grader check solutions`), in this process after torch
   is imported: the first pass (cold: first use of every op, spec imports) and the median of a few warm passes,
   for puzzles 1-4 and for all of them (Part II included).
2. The figures the simulator makes exact, measured on the reference solutions, beside their formulas:
   GPipe's bubble (p-1)/(m+p-1) with free messages; 1F1B's in-flight activations on stage 0 (p microbatches)
   against GPipe's (m); ZeRO-2's per-rank optimizer state K·Ψ/N; p1's compute with recomputation 4·L·F.
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.backends.learner_code import load_module
from grader.backends.simulator import observe
from grader.frontends.targets import REPO, grade_target
from grader.specs import SPECS  # noqa: E402
from puzzles.sim import CostModel  # noqa: E402


def timed(ids) -> float:
    start = time.perf_counter()
    results = grade_target("solutions", ids, seed=0)
    elapsed = time.perf_counter() - start
    assert all(r.status == "pass" for r in results), [(r.id, r.status) for r in results]
    return elapsed


def grading_times() -> None:
    print("## 1. grading the reference solutions (wall seconds, in-process, torch already imported)")
    cold = timed(None)
    warm_all = statistics.median(timed(None) for _ in range(3))
    warm_1_4 = statistics.median(timed(["p1", "p2", "p3", "p4"]) for _ in range(3))
    per = {pid: statistics.median(timed([pid]) for _ in range(3)) for pid in SPECS}
    print(f"  all {len(SPECS)}, first pass (cold):   {cold:6.2f} s")
    print(f"  all {len(SPECS)}, warm (median of 3):   {warm_all:6.2f} s")
    print(f"  p1-p4, warm (median of 3):     {warm_1_4:6.2f} s   target <= 2 s")
    print("  per puzzle, warm: " + ", ".join(f"{pid} {t:.2f} s" for pid, t in per.items()))


def observe_reference(pid: str, cost: CostModel | None = None):
    spec = copy.copy(SPECS[pid])
    if cost is not None:
        spec.cost = cost
    module = load_module(REPO / "solutions" / spec.filename)
    inputs = spec.make_inputs(0)
    return spec, observe(spec, module, inputs, 0)


def formulas() -> None:
    from grader.core.rules import flops
    from grader.specs.p6_one_f_one_b import spec as p6_one_f_one_b
    from grader.specs.p8_zero import spec as p8_zero
    from grader.specs.common import pipeline_values as p5_gpipe  # p5's (and p6's) sizes

    print("\n## 2. simulated figures against the formulas (reference solutions, seed 0)")
    p, m = p5_gpipe.P, p5_gpipe.M
    free = CostModel(latency_ticks=0, bytes_per_tick=None)
    pipeline = ((m + p - 1) * (p5_gpipe.FORWARD + p5_gpipe.BACKWARD).ticks
                + m * (p5_gpipe.LOSS_FORWARD + p5_gpipe.LOSS_BACKWARD).ticks)
    work = p5_gpipe.STAGE_WORK[p - 1].ticks
    print(f"  stage costs on the clock: F = {p5_gpipe.FORWARD.ticks:,} ticks, BW = {p5_gpipe.BACKWARD.ticks:,}, "
          f"LF + LB = {(p5_gpipe.LOSS_FORWARD + p5_gpipe.LOSS_BACKWARD).ticks:,}; W = {work:,}")
    print(f"  {'figure':<58} {'formula':>22} {'measured':>22}")
    for pid, name in (("p5", "GPipe"), ("p6", "1F1B")):
        _, obs = observe_reference(pid, free)
        print(f"  {name + ' makespan, free messages (+ 36 returning dL/dx)':<58} "
              f"{f'(m+p-1)(F+BW)+m(LF+LB) = {pipeline:,}':>22} {obs.makespan:>22,}")
    formula = Fraction(p - 1, m + p - 1)
    for pid, name in (("p5", "GPipe"), ("p6", "1F1B")):
        _, obs = observe_reference(pid)
        print(f"  {name + ' bubble 1 - W/makespan, graded cost model (1-tick msgs)':<58} "
              f"{f'(p-1)/(m+p-1) = {float(formula):.4f}':>22} {1 - work / obs.makespan:>22.4f}")
    act, static = p6_one_f_one_b.ACT, p6_one_f_one_b.STATIC
    for pid, name, held in (("p5", "GPipe", m), ("p6", "1F1B", p)):
        _, obs = observe_reference(pid)
        first_backward = min(e["start"] for e in obs.events_of(0, "compute", "backward"))
        dx = p5_gpipe.B * p5_gpipe.D * 8  # dL/dx, part of `static`, is allocated by the backward itself
        recv = p5_gpipe.MB * p5_gpipe.D * 8  # the buffer the first gradient is received into
        before = [b for t, b in obs.ledgers[0]["timeline"] if t < first_backward][-1] - (static - dx) - recv
        print(f"  {name + ' stage-0 activations held at its first backward':<58} "
              f"{f'{held}·A = {held * act:,} B':>22} {f'{Fraction(before, act)}·A = {before:,} B':>22}")
        peak = obs.peak_bytes[0] - static
        print(f"  {name + ' stage-0 peak above static (adds one gradient workspace)':<58} "
              f"{f'≈ {held}·A + d·h·8 = {held * act + 131072:,} B':>22} {f'{peak:,} B':>22}")
    spec, obs = observe_reference("p8")
    state = [c for c in spec.check(obs, spec.reference(spec.make_inputs(0)), spec.make_inputs(0))
             if c.name == "optimizer state"][0]
    psi, n, k = p8_zero.PSI, spec.world_size, p8_zero.STATE_BYTES_PER_WEIGHT
    print(f"  {'ZeRO-2 optimizer state per rank, K·Ψ/N (K=' + f'{k}, Ψ={psi:,}, N={n})':<58} "
          f"{f'{k * psi // n:,} B':>22} {f'{state.measured:,} B':>22}")
    spec, obs = observe_reference("p1")
    budget = spec.budgets(spec.make_inputs(0))["compute"].value
    print(f"  {'p1 compute with recomputation, L·(2F + BK) + L·B·d FLOPs':<58} {f'{budget:,}':>22} "
          f"{f'{flops(obs, 0):,}':>22}")


if __name__ == "__main__":
    print(f"# bench_grading.py  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} intra-op threads")
    grading_times()
    formulas()
