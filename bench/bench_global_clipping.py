"""p19 (global gradient clipping and non-finite steps under ZeRO-2 x tensor parallel): the figures against their
formulas, and the numbers the puzzle's text promises.

    python bench/bench_global_clipping.py [--seeds 1000]

1. The inputs' promise, over many seeds: the serial norm at step 2 (targets x4) above max_norm = 100, at steps 1
   and 4 (targets x1) below it: the smallest clipped norm and the largest unclipped one.
2. The reference's figures at seed 0, per rank: the bytes its optimizer sends by kind (formula: 7 reduce-scatters
   and 4 all-gathers of (D-1)/D·8·Ψ_r, 14 scalar all-reduces of 8 bytes over a pair) against the budget
   7·2(D-1)/D·8·Ψ_r + 1 KiB; its optimizer state against 3·8·Ψ_r/D; the harness's own bytes (not counted).
3. What the common mistakes report at step 1 against the global norm (the ratio): the replicated parameters
   counted T times (sqrt(1 + share of the replicated squares)), a local norm (each rank its shard), the norm over
   one group only, the gradients summed over the replicas (x D); and the verdicts of the naive answers.
4. Wall time of grading the reference on the simulator and on gloo.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.backends import real  # noqa: E402
from grader.backends.learner_code import load_module  # noqa: E402
from grader.backends.simulator import grade_file, observe  # noqa: E402
from grader.core.rules import sent  # noqa: E402
from grader.core.spec import Observation  # noqa: E402
from grader.frontends.targets import REPO  # noqa: E402
from grader.specs import SPECS  # noqa: E402
from grader.specs.p19_global_clipping import layout as lay  # noqa: E402

SPEC = SPECS["p19"]


def promise(seeds: int) -> None:
    print(f"## 1. the clipped and unclipped steps over {seeds} seeds (serial norms; max_norm = {lay.MAX_NORM:g})")
    clipped, unclipped = [], []
    for seed in range(seeds):
        inputs = SPEC.make_inputs(seed)
        norms = lay.torch_reference(inputs["params"], inputs["batches"], lay.skipped_steps(lay.FAULTS))["norms"]
        clipped.append(norms[1])
        unclipped += [norms[0], norms[3]]
    print(f"  step 2 (clipped):      min {min(clipped):.2f}, median {statistics.median(clipped):.2f}")
    print(f"  steps 1, 4 (left):     max {max(unclipped):.2f}, median {statistics.median(unclipped):.2f}")
    print(f"  every seed on its side of max_norm: {min(clipped) > lay.MAX_NORM > max(unclipped)}")


def figures() -> None:
    print("## 2. the reference at seed 0: bytes and state against the formulas")
    inputs = SPEC.make_inputs(0)
    obs = observe(SPEC, load_module(REPO / "solutions" / SPEC.filename), inputs, 0)
    mine = [e for e in obs.events if not e["site"].startswith("[harness]")]
    theirs = [e for e in obs.events if e["site"].startswith("[harness]")]
    rs = (lay.D - 1) * 8 * lay.PSI_RANK // lay.D
    formula = 7 * rs + 4 * rs + 14 * 8
    budget = SPEC.budgets(inputs)
    for r in range(lay.N):
        learner = sent(Observation(obs.results, obs.peak_bytes, obs.ledgers, mine, obs.makespan), r)
        harness = sent(Observation(obs.results, obs.peak_bytes, obs.ledgers, theirs, obs.makespan), r)
        total = sum(b for _, b in learner.values())
        print(f"  rank {r}: optimizer sent {total:,} bytes (formula 7·{rs:,} + 4·{rs:,} + 14·8 = {formula:,}; "
              f"budget {budget['communication'].value:,}) "
              f"{ {k: v for k, v in sorted(learner.items())} }; the harness's forward/backward "
              f"{sum(b for _, b in harness.values()):,} (not counted)")
        print(f"          state after each step {obs.results[r]['state_per_step']} (formula 3·8·Ψ_r/D = "
              f"{3 * 8 * lay.SHARD:,}; budget {budget['optimizer state'].value:,})")
    print(f"  makespan {obs.makespan:,} ticks")


def mistakes() -> None:
    print("## 3. what the mistakes report at step 1, against the global norm (seeds 0-4)")
    for seed in range(5):
        inputs = SPEC.make_inputs(seed)
        grads = lay.gradient(inputs["params"], inputs["batches"][0])
        true = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        share = sum(float((g * g).sum()) for n, g in grads.items() if lay.REPLICATED[n.split(".")[-1]]) / true ** 2
        ratios = [f"{value / true:.4f}" for value, _ in lay.norm_candidates(grads, 0)]
        print(f"  seed {seed}: norm {true:.3f}, replicated share of the squares {share:.4f} "
              f"(counted twice: sqrt(1 + share) = {math.sqrt(1 + share):.4f}); rank 0's candidates / norm: "
              f"{', '.join(ratios)}")
    for answer in ("naive/p19_global_clipping.py", "wrong/p19_replicated_counted_twice.py",
                   "wrong/p19_rank_local_skip.py"):
        result = grade_file(SPEC, REPO / "tests" / answer, seed=0)
        failed = [(c.name, c.diagnosis[:90]) for c in result.checks if not c.passed]
        print(f"  {answer}: {result.status}; {failed}")


def timing() -> None:
    print("## 4. grading the reference (wall seconds, median of 3)")
    sim = statistics.median(_timed(lambda: grade_file(SPEC, REPO / "solutions" / SPEC.filename, 0)) for _ in range(3))
    gloo = statistics.median(_timed(lambda: real.grade_folder(REPO / "solutions", [SPEC], 0)) for _ in range(3))
    print(f"  simulator {sim:.2f} s, gloo (4 processes, a fresh group each time) {gloo:.2f} s")


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=1000)
    args = parser.parse_args()
    promise(args.seeds)
    figures()
    mistakes()
    timing()
