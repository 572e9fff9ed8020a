"""p13 (collectives from send/recv): the reference's figures against their formulas, and the crossover.

    python bench/bench_collectives.py

1. Each of the eight graded runs of the reference (seed 0), every rank: the bytes it sent against 2(N-1)/N·S (ring)
   and log2(N)·S (recursive doubling), the makespan against the α-β formula, 2(N-1)(α + S/(Nβ)) and
   log2(N)(α + S/β), with the adds on the critical path ((N-1) adds of a chunk, log2 N of the tensor) and the budget,
   and the bytes held beyond t against the budget. The naive answer (gather everything, then sum) beside it.
2. The crossover: the α-β formulas' S* = α/β·(2(N-1) - log2 N)/(log2 N - 2(N-1)/N), and the size where the two
   reference functions, run alone on the puzzle's clock (sim.run, N ranks, t placed by the harness), change places,
   found by sweeping S in steps of N·8·8 bytes; each function's makespan on both sides of it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.backends.learner_code import load_module  # noqa: E402
from grader.backends.simulator import observe  # noqa: E402
from grader.frontends.targets import REPO  # noqa: E402
from grader.specs import SPECS  # noqa: E402
from grader.specs.p13_collectives.mistakes import sent_in  # noqa: E402
from grader.specs.p13_collectives.runs import (ALPHA, COST, LINK, RUNS, comm_by_run, crossover_bytes,  # noqa: E402
                                               held_beyond, run_makespan)
from puzzles import sim  # noqa: E402

SPEC = SPECS["p13"]
REFERENCE = load_module(REPO / "solutions" / SPEC.filename)


def observe_file(path: Path, seed: int = 0):
    return observe(SPEC, load_module(path), SPEC.make_inputs(seed), seed)


def figures(title: str, path: Path) -> None:
    obs = observe_file(path)
    print(f"\n### {title} ({path.relative_to(REPO)}, seed 0)")
    print("| run | bytes sent per rank (min..max) | formula | makespan, worst world | α-β formula | + adds | "
          "budget | held beyond t (max) | budget |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for i, run in enumerate(RUNS):
        sent = [sent_in(comm_by_run(obs, r)[i]) for r in range(8)]
        span = max(run_makespan(obs, i, tuple(range(w, w + run.n))) for w in range(0, 8, run.n))
        held = max(held_beyond(obs, r, obs.results[r]["marks"][i]) for r in range(8))
        print(f"| {run.key} | {min(sent):,}..{max(sent):,} | {run.sent_bytes:,} | {span:,} | "
              f"{run.alpha_beta_ticks:,} | {run.reduction_ticks:,} | {run.makespan_budget:,} | {held:,} | "
              f"{run.held_budget:,} |")


def alone(function, n: int, numel: int) -> int:
    """The makespan of `function` run alone on n ranks on a tensor of `numel` float64 elements."""
    tensors = [torch.randn(numel, dtype=torch.float64) for _ in range(n)]
    expected = torch.stack(tensors).sum(0)

    def program(dist, t):
        function(dist, t)
        return t

    result = sim.run(program, n, rank_args=[(t,) for t in tensors], cost=COST)
    assert all(torch.allclose(t, expected) for t in result.results)
    return result.makespan


def crossover(n: int) -> None:
    step = 8 * n  # elements: S a multiple of N·8 elements
    star = crossover_bytes(n)
    rows = []
    for numel in range(step, 16384 + 1, step):  # up to 128 KiB, past both crossovers
        ring = alone(REFERENCE.ring_all_reduce, n, numel)
        doubling = alone(REFERENCE.recursive_doubling_all_reduce, n, numel)
        rows = [*rows[-1:], (numel, ring, doubling)]
        if doubling >= ring:  # the first size at which doubling is no longer the faster
            break
    print(f"\n### N = {n}: α-β crossover S* = {star:,.1f} bytes ({star / 1024:.1f} KiB); on the clock, with the "
          f"adds:")
    print("| S (bytes) | ring makespan | doubling makespan | faster |")
    print("| ---: | ---: | ---: | --- |")
    for numel, ring, doubling in rows:
        print(f"| {numel * 8:,} ({numel * 8 / 1024:.1f} KiB) | {ring:,} | {doubling:,} | "
              f"{'doubling' if doubling < ring else 'ring' if ring < doubling else 'neither (equal)'} |")


def main() -> None:
    print(f"# p13: the network α = {ALPHA} ticks, {LINK} bytes/tick (α/β = {ALPHA * LINK:,} bytes)")
    print("\n## 1. The graded runs against their formulas")
    figures("reference", REPO / "solutions" / SPEC.filename)
    figures("naive: gather everything, then sum", REPO / "tests" / "naive" / SPEC.filename)
    print("\n## 2. The crossover")
    for n in (4, 8):
        crossover(n)


if __name__ == "__main__":
    main()
